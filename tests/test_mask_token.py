"""The mask token of every tokenizer encoderlab trains reads "a [MASK] of" as the user means it: the mask stands for
a word and its leading space, as pretraining masks it, so no lone-space token sits before it and a filled-in sentence
has no double space. The saved tokenizer keeps this through save/load, with and without encoderlab."""

import json
import subprocess
import sys

import pytest
from remote_code import without_encoderlab
from tiny_checkpoints import save_tiny_dta_mlm
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

from encoderlab.tokenization import TRAINED_TOKENIZERS, build_tokenizer
from encoderlab.training.demo import EXAMPLE, fill_mask_example

SENTENCE = "The function returns a {mask} of strings."
WORDS = [" value", " list", " string"]
"""Fill-in candidates: words the tiny vocabularies hold as one token with its leading space (BPE) or as a word."""


@pytest.fixture(scope="module", params=sorted(TRAINED_TOKENIZERS))
def trained(request):
    from pydoc_data.topics import topics

    return build_tokenizer(request.param, list(topics.values()), vocab_size=1000, model_max_length=128)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, trained):
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("mlm"), trained)


def tokens_around_mask(tokenizer, text):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
    at = tokens.index(tokenizer.mask_token)
    return tokens[at - 1], tokens[at + 1]


def lone_space(tokenizer, token):
    return tokenizer.convert_tokens_to_string([token]).strip() == ""


def test_no_lone_space_token_before_the_mask(trained):
    before, after = tokens_around_mask(trained, SENTENCE.format(mask=trained.mask_token))
    assert not lone_space(trained, before), before
    assert trained.convert_tokens_to_string([before]).strip() == "a"
    assert trained.convert_tokens_to_string([after]).strip() == "of"


def test_the_saved_tokenizer_keeps_it(trained, run_folder):
    reloaded = AutoTokenizer.from_pretrained(run_folder)
    text = SENTENCE.format(mask=reloaded.mask_token)
    assert reloaded(text)["input_ids"] == trained(text)["input_ids"]
    saved_again = run_folder.parent / f"{run_folder.name}_again"
    reloaded.save_pretrained(saved_again)  # a fine-tuning run saves the tokenizer it loaded
    assert AutoTokenizer.from_pretrained(saved_again)(text)["input_ids"] == trained(text)["input_ids"]


def byte_level(tokenizer):
    return type(tokenizer.backend_tokenizer.pre_tokenizer).__name__ == "ByteLevel"


def assert_filled_without_double_space(predictions, text, mask, exact):
    """Each filled sequence is the text with the predicted word where the mask was: byte-level BPE decodes losslessly,
    so exactly the text before the mask (without the space the mask took), the word as decoded (its own leading space
    included) and the text after it; WordPiece decodes words joined by spaces, lowercased."""
    prefix, suffix = text.split(mask)
    for prediction in predictions:
        sequence, word = prediction["sequence"], prediction["token_str"]
        assert "  " not in sequence or "  " in word, sequence  # (a random model may predict a run of spaces)
        if exact:
            assert sequence == prefix.rstrip() + word + suffix, (sequence, word)
        else:
            assert sequence == (prefix.rstrip() + " " + word.strip() + suffix).lower(), (sequence, word)


def test_fill_mask_pipeline_fills_in_a_word_without_double_space(run_folder):
    tokenizer = AutoTokenizer.from_pretrained(run_folder)
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(run_folder), tokenizer=tokenizer)
    text = SENTENCE.format(mask=tokenizer.mask_token)
    predictions = fill(text, targets=WORDS)
    assert len(predictions) == len(WORDS)
    assert_filled_without_double_space(predictions, text, tokenizer.mask_token, byte_level(tokenizer))


def test_the_demos_fill_mask_example_reads_the_mask_as_a_word(run_folder):
    tokenizer = AutoTokenizer.from_pretrained(run_folder)
    if not byte_level(tokenizer):
        pytest.skip("the demo trains a byte-level BPE tokenizer")
    before, _ = tokens_around_mask(tokenizer, EXAMPLE.format(mask=tokenizer.mask_token))
    assert not lone_space(tokenizer, before), before
    predictions = fill_mask_example(run_folder)  # the random tiny model may predict any token, "Ġthe" or "F"
    assert len(predictions) == 5
    assert_filled_without_double_space(
        predictions, EXAMPLE.format(mask=tokenizer.mask_token), tokenizer.mask_token, exact=True
    )


REMOTE_FILL = without_encoderlab("""
    import json, sys
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline
    folder, text, words = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
    print(json.dumps({"tokens": tokens, "predictions": fill(text, targets=words)}))
""")


def test_without_encoderlab_through_trust_remote_code(run_folder, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(run_folder)
    text = SENTENCE.format(mask=tokenizer.mask_token)
    script = tmp_path / "remote.py"
    script.write_text(REMOTE_FILL)
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-I", str(script), str(run_folder), text, json.dumps(WORDS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    remote = json.loads(done.stdout.strip().splitlines()[-1])
    assert remote["tokens"] == tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
    assert_filled_without_double_space(remote["predictions"], text, tokenizer.mask_token, byte_level(tokenizer))
