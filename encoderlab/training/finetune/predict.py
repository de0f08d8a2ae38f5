"""Predictions of fine-tuned classifiers, the Python API (``encoderlab predict classify`` / ``predict tokens`` is
`encoderlab.training.finetune.predict_cli`).

The inputs are encoded exactly as in fine-tuning (`encoderlab.training.finetune.sequence` / ``tokens``): texts
(and pairs) with the tokenizer's special tokens, truncated to the tokenizer's ``model_max_length`` (the run's
``data.max_length``); words or residues in overlapping windows, each word labelled by the window that owns it.
Label names come from the model config (``id2label``). A protein tokenizer's inputs are first checked against its
residue alphabet, as fine-tuning checks its data: an empty sequence, or one with a character the tokenizer does not
know (J, ``*``, a digit, a space), is an error naming the input, unless unknown characters are allowed
(``unknown_residues="allow"``, ``--unknown-residues allow``: they are read as the unknown token and counted).

```python
from encoderlab.training.finetune.predict import load_classifier, classify, tag

model, tokenizer = load_classifier("runs/finetune/sst2")
classify(model, tokenizer, ["a charming film"])      # [{"label": "positive", "score": 0.93}]
model, tokenizer = load_classifier("runs/finetune/secondary_structure", task="token")
tag(model, tokenizer, ["MKVLAAGIVW"])                # [[{"word": "M", "label": "C", "score": 0.71}, ...]]
```
"""

from pathlib import Path

import numpy as np

from .model_path import check_model_head, check_model_path, not_found_error
from .tokens import as_words, encode_words

# Imported inside functions (cost): torch, transformers and encoderlab.tokenization, so that --help and check() answer
# without them (encoderlab/cli.py).

AUTO_CLASSES = {"classify": "AutoModelForSequenceClassification", "token": "AutoModelForTokenClassification"}
COMMANDS = {"classify": "encoderlab predict classify", "token": "encoderlab predict tokens"}


def load_classifier(path: str, task: str = "classify", trust_remote_code: bool = False):
    """(model in eval mode, tokenizer) of a fine-tuned run folder or Hub id; `task` is ``classify`` or ``token``.
    A checkpoint without that head (a masked LM, a classifier for ``token``) is a ValueError before it loads."""
    import transformers

    if task not in AUTO_CLASSES:
        raise ValueError(f"task={task!r}; allowed: {sorted(AUTO_CLASSES)}")
    check_model_path(path, key="--model")
    check_model_head(path, AUTO_CLASSES[task], COMMANDS[task])
    try:
        model = getattr(transformers, AUTO_CLASSES[task]).from_pretrained(path, trust_remote_code=trust_remote_code)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as error:
        if Path(path).is_dir():
            raise
        raise not_found_error(path, error, key="--model") from None
    return model.eval(), tokenizer


def logits_of(model, tokenizer, encodings: list[dict], batch_size: int) -> list[np.ndarray]:
    """Logits of each encoded input (``input_ids``, ``attention_mask``), unpadded."""
    import torch

    with torch.no_grad():
        outputs = []
        for start in range(0, len(encodings), batch_size):
            chunk = [
                {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"]}
                for e in encodings[start : start + batch_size]
            ]
            batch = tokenizer.pad(chunk, return_tensors="pt").to(model.device)
            logits = model(**batch).logits.float().cpu().numpy()
            outputs += [
                logits[i] if logits.ndim == 2 else logits[i, : len(chunk[i]["input_ids"])] for i in range(len(chunk))
            ]
        return outputs


def check_residues(
    tokenizer,
    inputs: list[tuple[str, ...]],
    names: list[str] | None = None,
    unknown_residues: str = "error",
    setting: str = "unknown_residues='allow'",
):
    """Each input's text(s) checked against a protein tokenizer's residue alphabet
    (`encoderlab.tokenization.residues.ResidueChecker`; a list of words is read joined): an empty sequence, or with
    ``unknown_residues="error"`` one with a character outside the alphabet, is a ValueError naming the input
    (`names`, default ``input N``). Returns the counts, or None for a text tokenizer (not checked)."""
    from ...tokenization.residues import ResidueChecker

    checker = ResidueChecker(tokenizer, unknown_residues, setting)
    if not checker.active:
        return None
    for number, texts in enumerate(inputs, start=1):
        name = names[number - 1] if names else f"input {number}"
        for text in texts:
            text = text if isinstance(text, str) else "".join(map(str, text))
            if not text.strip():
                raise ValueError(f"{name}: the sequence is empty")
            checker.check(text, name)
    return checker.counts


def classify(
    model,
    tokenizer,
    texts: list[str],
    text_pairs: list[str] | None = None,
    batch_size: int = 32,
    unknown_residues: str = "error",
):
    """Per text: ``{"label", "score"}`` (softmax probability), ``{"score"}`` for regression, or
    ``{"labels": [...], "scores": [...]}`` (sigmoid > 0.5) for multi-label models. A protein model's inputs are
    checked first (`check_residues`)."""
    if text_pairs is not None and len(text_pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs; give one pair per text or none")
    check_residues(
        tokenizer,
        list(zip(texts, text_pairs, strict=True)) if text_pairs else [(text,) for text in texts],
        unknown_residues=unknown_residues,
    )
    encoded = tokenizer(texts, text_pairs, truncation=True, max_length=tokenizer.model_max_length)
    encodings = [
        {"input_ids": ids, "attention_mask": mask}
        for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
    ]
    names = model.config.id2label
    results = []
    for logits in logits_of(model, tokenizer, encodings, batch_size):
        if model.config.problem_type == "regression" or model.config.num_labels == 1:
            results.append({"score": float(logits[0])})
        elif model.config.problem_type == "multi_label_classification":
            scores = 1 / (1 + np.exp(-logits))
            results.append(
                {
                    "labels": [names[i] for i in np.flatnonzero(scores > 0.5)],
                    "scores": {names[i]: float(score) for i, score in enumerate(scores)},
                }
            )
        else:
            probabilities = np.exp(logits - logits.max())
            probabilities /= probabilities.sum()
            best = int(probabilities.argmax())
            results.append({"label": names[best], "score": float(probabilities[best])})
    return results


def tag(model, tokenizer, sequences: list, batch_size: int = 32, unknown_residues: str = "error") -> list[list[dict]]:
    """Per sequence (a string of residues, a space-separated sentence, or a list of words): one
    ``{"word", "label", "score"}`` per word; long sequences in windows, so every word gets a label. A protein
    model's inputs are checked first (`check_residues`)."""
    check_residues(tokenizer, [(sequence,) for sequence in sequences], unknown_residues=unknown_residues)
    names = model.config.id2label
    windows, owners = [], []
    words_of = [as_words(sequence, "text", "input", number) for number, sequence in enumerate(sequences, start=1)]
    for index, words in enumerate(words_of):
        for window in encode_words(tokenizer, words, tokenizer.model_max_length):
            windows.append(window)
            owners.append(index)
    tags = [[None] * len(words) for words in words_of]
    for window, index, logits in zip(windows, owners, logits_of(model, tokenizer, windows, batch_size), strict=True):
        own_start, own_end = window["owned"]
        for position, word in enumerate(window["word_ids"]):
            if word is not None and own_start <= word < own_end:
                probabilities = np.exp(logits[position] - logits[position].max())
                probabilities /= probabilities.sum()
                best = int(probabilities.argmax())
                tags[index][word] = {
                    "word": words_of[index][word],
                    "label": names[best],
                    "score": float(probabilities[best]),
                }
    return tags
