"""Answers from an extractive QA model: `answer_questions` and `load_model`, the Python API (``encoderlab predict
qa`` is `encoderlab.training.finetune.predict_qa_cli`).

transformers 5.x has no extractive ``question-answering`` pipeline any more; this is its replacement, with the
post-processing the SQuAD evaluation uses (`encoderlab.training.finetune.squad.postprocess`)::

    import encoderlab
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer
    from encoderlab.training.finetune.predict_qa import answer_questions

    model = AutoModelForQuestionAnswering.from_pretrained("runs/squad_v2")
    tokenizer = AutoTokenizer.from_pretrained("runs/squad_v2")
    [answer] = answer_questions(model, tokenizer, "Who ruled Normandy?", "In 1066 Normandy was ruled by William.")
    answer["answer"], answer["score"], answer["start"], answer["end"]  # context[start:end] == answer
"""

import math
from pathlib import Path

from .model_path import check_model_head, check_model_path, not_found_error
from .squad import check_fast_tokenizer, check_window_settings, postprocess, prepare_features

# Imported inside functions (cost): torch and transformers, so that --help and check() answer without them
# (encoderlab/cli.py).

NULL_THRESHOLD_ATTRIBUTE = "qa_null_threshold"
"""Model-config attribute of a model fine-tuned on SQuAD v2: the no-answer threshold chosen on its evaluation set.
Without it (a SQuAD v1.1 model) every question gets a span unless `null_threshold` is given."""


DEFAULT_DOC_STRIDE = 128
"""Tokens neighbouring windows share by default, as transformers' QA examples do, at most half the window."""

MAX_DEFAULT_LENGTH = 8192
"""A tokenizer's ``model_max_length`` above this is transformers' "no limit" sentinel, not a window length."""


def as_list(name: str, value) -> list[str]:
    values = [value] if isinstance(value, str) else list(value)
    if not values:
        raise ValueError(f"{name} is an empty list; give a string or a list of strings")
    bad = [i for i, text in enumerate(values) if not isinstance(text, str) or not text.strip()]
    if bad:
        raise ValueError(f"{name} must be non-empty strings; entries {bad[:10]} are empty or not strings")
    return values


def check_questions_fit(tokenizer, questions: list[str], max_length: int, doc_stride: int) -> None:
    """Questions are never truncated: each must leave more than `doc_stride` context tokens in a window."""
    room = max_length - tokenizer.num_special_tokens_to_add(pair=True) - doc_stride
    lengths = [len(ids) for ids in tokenizer([q.lstrip() for q in questions], add_special_tokens=False)["input_ids"]]
    too_long = [i for i, length in enumerate(lengths) if length >= room]
    if too_long:
        raise ValueError(
            f"questions {too_long[:10]} are too long ({max(lengths[i] for i in too_long)} tokens) for "
            f"max_length={max_length} and doc_stride={doc_stride}: a question may take at most "
            f"{room - 1} tokens; raise max_length or lower doc_stride"
        )


def answer_questions(
    model,
    tokenizer,
    questions,
    contexts,
    *,
    max_length: int | None = None,
    doc_stride: int | None = None,
    max_answer_length: int = 30,
    n_best: int = 20,
    null_threshold: float | None = None,
    batch_size: int = 32,
    return_n_best: bool = False,
) -> list[dict]:
    """The answer to each question in its context.

    Args:
        model: an ``AutoModelForQuestionAnswering`` model (start/end logits per token).
        tokenizer: its fast tokenizer (character offsets are needed; a slow one raises `ValueError`).
        questions, contexts: a string each, or equally long lists of strings.
        max_length, doc_stride: window length in tokens and the tokens neighbouring windows share; long contexts
            are read in overlapping windows and the answer is the best span over all of them. Default length: the
            tokenizer's ``model_max_length`` (a fine-tuned run saves its ``data.max_length`` there), or 384; default
            stride: 128 tokens, or half the window when that is shorter (a 96-token window shares 48).
        max_answer_length: longest answer in tokens. n_best: candidate spans kept per question.
        null_threshold: "no answer" when the null score (first token) exceeds the best span's score by more than
            this; default: the model config's ``qa_null_threshold`` (set by a SQuAD v2 fine-tune), or never.
        batch_size: windows per forward pass.
        return_n_best: also return the ranked candidates (``n_best``: text, start, end, score, logit).

    Returns:
        One dict per question: ``answer`` (text, "" for no answer), ``score`` (probability of the answer among the
        candidates and the null answer), ``start``/``end`` (character span in the context, ``context[start:end] ==
        answer``; ``None`` for no answer) and ``no_answer_score`` (null score minus best span score; ``None`` when
        the context holds no candidate span).
    """
    questions, contexts = as_list("questions", questions), as_list("contexts", contexts)
    if len(questions) != len(contexts):
        raise ValueError(f"questions and contexts must have the same length, got {len(questions)} and {len(contexts)}")
    check_fast_tokenizer(tokenizer)
    if max_length is None:  # transformers sets a huge sentinel when a tokenizer has no limit of its own
        max_length = tokenizer.model_max_length if tokenizer.model_max_length <= MAX_DEFAULT_LENGTH else 384
    if doc_stride is None:
        doc_stride = min(DEFAULT_DOC_STRIDE, max_length // 2)
    check_window_settings(max_length, doc_stride)
    check_questions_fit(tokenizer, questions, max_length, doc_stride)
    if null_threshold is None:
        null_threshold = getattr(model.config, NULL_THRESHOLD_ATTRIBUTE, None)
    examples = {"id": [str(i) for i in range(len(questions))], "question": questions, "context": contexts}
    windows = prepare_features(examples, tokenizer, max_length, doc_stride)
    start_logits, end_logits = window_logits(model, tokenizer, windows, batch_size)
    answers = postprocess(
        [{"id": i, "context": c} for i, c in zip(examples["id"], contexts, strict=True)],
        windows,
        start_logits,
        end_logits,
        version_2=null_threshold is not None,
        n_best=n_best,
        max_answer_length=max_answer_length,
        null_threshold=null_threshold or 0.0,
    )
    keys = ("answer", "score", "start", "end", "no_answer_score") + (("n_best",) if return_n_best else ())
    answers = [{key: answer[key] for key in keys} for answer in answers]
    for answer in answers:  # no candidate span at all: no score to compare with the null answer
        if not math.isfinite(answer["no_answer_score"]):
            answer["no_answer_score"] = None
    return answers


def window_logits(model, tokenizer, windows: dict, batch_size: int) -> tuple[list, list]:
    """Start and end logits (float64 numpy rows, each the window's own length) of every window."""
    import torch

    with torch.no_grad():
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        model.eval()
        device = next(model.parameters()).device
        starts, ends = [], []
        for first in range(0, len(windows["input_ids"]), batch_size):
            chunk = slice(first, first + batch_size)
            columns = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in windows]
            rows = [
                dict(zip(columns, values, strict=True))
                for values in zip(*(windows[key][chunk] for key in columns), strict=True)
            ]
            batch = tokenizer.pad(rows, padding=True, padding_side="right", return_tensors="pt").to(device)
            output = model(**batch)
            for row, length in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
                starts.append(output.start_logits[row, :length].double().cpu().numpy())
                ends.append(output.end_logits[row, :length].double().cpu().numpy())
        return starts, ends


def load_model(path: str):
    """(QA model, tokenizer) of a run folder or Hub id; a checkpoint without a question-answering head is a
    ValueError before it loads."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    check_model_path(path, key="--model")
    check_model_head(path, "AutoModelForQuestionAnswering", "encoderlab predict qa")
    try:
        return AutoModelForQuestionAnswering.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    except OSError as error:
        if Path(path).is_dir():
            raise
        raise not_found_error(path, error, key="--model") from None
