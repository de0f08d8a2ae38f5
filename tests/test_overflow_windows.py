"""The guard against tokenizers releases that drop overflowing windows (tokenizers 0.23.2 keeps only each text's
first window): pretraining and SQuAD windows must refuse such a tokenizer instead of cutting documents short."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from encoderlab.tokenization import TOKENIZER_BUILDERS, TRAINED_TOKENIZERS, build_tokenizer, train_bpe_tokenizer
from encoderlab.tokenization.windows import check_overflowing_windows
from encoderlab.training.data import tokenize_to_examples
from encoderlab.training.finetune import squad
from encoderlab.training.sources import load_documents


class FirstWindowOnly:
    """A fast tokenizer as tokenizers 0.23.2 makes it behave: of each text's overflowing windows only the first
    comes back."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        encoded = self._tokenizer(*args, **kwargs)
        if not kwargs.get("return_overflowing_tokens"):
            return encoded
        samples = encoded["overflow_to_sample_mapping"]
        first = [i for i, sample in enumerate(samples) if i == 0 or samples[i - 1] != sample]
        return {key: [value[i] for i in first] for key, value in encoded.items()}


@pytest.fixture(scope="module")
def corpus():
    return list(load_documents("embedded"))[:40]


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe_tokenizer(corpus, vocab_size=512)


def test_a_working_tokenizer_passes_and_keeps_every_token(corpus, bpe):
    check_overflowing_windows(bpe)
    examples = tokenize_to_examples(corpus[:5], bpe, 32, mode="chunk")["input_ids"]
    whole = sum(len(bpe(doc, add_special_tokens=False)["input_ids"]) for doc in corpus[:5])
    assert sum(len(ids) - 2 for ids in examples) == whole


def test_pretraining_windows_refuse_a_tokenizer_that_drops_overflow(corpus, bpe):
    with pytest.raises(RuntimeError, match=r"overflowing windows hold \d+ of the \d+ tokens.*tokenizers>=0.23.3"):
        tokenize_to_examples(corpus[:5], FirstWindowOnly(bpe), 32, mode="chunk")


def test_squad_windows_refuse_a_tokenizer_that_drops_overflow(bpe):
    examples = {"id": ["0"], "question": ["Who ruled?"], "context": ["William ruled Normandy in 1066. " * 20]}
    assert len(squad.prepare_features(examples, bpe, 32, 8)["input_ids"]) > 1
    with pytest.raises(RuntimeError, match="overflowing windows hold"):
        squad.prepare_features(examples, FirstWindowOnly(bpe), 32, 8)


@pytest.mark.parametrize("name", sorted(TOKENIZER_BUILDERS))
def test_the_probe_cuts_every_shipped_tokenizer_into_several_windows(name):
    """At each builder's default vocabulary size and length (the trained ones on the whole embedded corpus): a probe
    that gave a single window would pass a tokenizer that drops every window after the first."""
    documents = list(load_documents("embedded")) if name in TRAINED_TOKENIZERS else None
    tokenizer = build_tokenizer(name, documents)
    check_overflowing_windows(tokenizer)
    with pytest.raises(RuntimeError, match="overflowing windows hold"):
        check_overflowing_windows(FirstWindowOnly(tokenizer))
