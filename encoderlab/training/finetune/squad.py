"""Extractive question answering (SQuAD v1.1 / v2.0): data, windows, training targets, answers and the task kind.

The pieces, each a plain function so that fine-tuning, evaluation and `encoderlab predict qa` share them:

- `load_squad`: the official JSON files or the Hub datasets ``rajpurkar/squad`` / ``rajpurkar/squad_v2`` as a
  list of examples ``{id, title, context, question, answers: {text: [...], answer_start: [...]}}``. An answer whose
  ``answer_start`` does not point at its text is skipped and counted in the log (as is an answerable question left
  with no answer), never a crash mid-run.
- `prepare_features`: each question with its context, cut into overlapping windows of ``max_length`` tokens
  (``doc_stride`` tokens shared by neighbouring windows) from the fast tokenizer's character offsets. The question
  comes first and is never truncated; training targets are the answer's first and last token, or the first token
  (``[CLS]``) when the answer is not inside the window or the question has none.
- `postprocess`: the n best (start, end) token pairs over all windows of an example (context tokens only,
  ``start <= end``, at most ``max_answer_length`` tokens), each answer sliced from the original context by its
  character offsets, so ``context[start:end] == answer`` always. v2: the null score (start and end logits of the
  first token) against the best span; the example is answered "" when ``null - best > threshold``.
- `QuestionAnsweringKind`: the `TaskKind` of the fine-tuning registry (``squad_v1``, ``squad_v2``); metrics come
  from the packaged ``squad`` metric module (EM and F1, v2 also HasAns / NoAns and the best threshold).
"""

import json
import logging
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..text_files import read_text_file
from .data import hub_dataset_error, kept_rows, public_file_name, test_file_split
from .tasks import HubLayout, Task, TaskKind, register_task

# Imported inside functions (cost): datasets, encoderlab.tokenization (transformers) and encoderlab.metrics (evaluate),
# so that --help and check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)

HUB_DATASETS = {False: "rajpurkar/squad", True: "rajpurkar/squad_v2"}
"""version_2 -> the Hub dataset id of the full SQuAD train/dev sets."""
HUB_CONFIGS = {False: "plain_text", True: "squad_v2"}
"""version_2 -> the config of that Hub dataset (its only one; the model-index names it)."""

LOCAL_FILES = {
    False: {"train": "train-v1.1.json", "validation": "dev-v1.1.json"},
    True: {"train": "train-v2.0.json", "validation": "dev-v2.0.json"},
}
"""version_2 -> the official file names, looked up in a local ``data.path`` folder."""

NULL_INDEX = 0
"""The token whose start and end logits score "no answer": the first one ([CLS])."""


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def read_squad_json(path: str | Path, articles: slice = slice(None)) -> list[dict]:
    """Examples of an official SQuAD JSON file (``data[].paragraphs[].qas[]``), answers unchecked; `articles`:
    the slice of its articles to read (train on some articles of a file, evaluate on the others)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"SQuAD file {str(path)!r} does not exist; expected an official SQuAD v1.1/v2.0 JSON file")
    try:
        articles_in_file = json.loads(read_text_file(path))["data"]  # not UTF-8: named with the byte offset
        return [
            {
                "id": qa["id"],
                "title": article.get("title", ""),
                "context": paragraph["context"],
                "question": qa["question"],
                "answers": {
                    "text": [a["text"] for a in qa.get("answers", [])],
                    "answer_start": [a["answer_start"] for a in qa.get("answers", [])],
                },
                "is_impossible": bool(qa.get("is_impossible", False)),
            }
            for article in articles_in_file[articles]
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"SQuAD file {str(path)!r} is not in the official format "
            f"data[].paragraphs[].{{context, qas[].{{id, question, answers}}}}: {error!r}"
        ) from None


ARTICLE_SLICE = re.compile(r"^(?P<path>.+\.json)\[(?P<start>\d*):(?P<stop>\d*)\]$")
"""``FILE.json[a:b]``: articles a..b-1 of a JSON file, e.g. ``dev-v2.0.json[0:3]`` to train, ``[3:5]`` to evaluate."""


def parse_source(source: str | Path) -> tuple[str, slice]:
    match = ARTICLE_SLICE.match(str(source))
    if not match:
        return str(source), slice(None)
    start, stop = (int(match[key]) if match[key] else None for key in ("start", "stop"))
    if start is not None and stop is not None and start >= stop:
        raise ValueError(
            f"SQuAD source {str(source)!r} selects no article: {start}:{stop} is empty (allowed: "
            "FILE.json[a:b] with a < b, either side may be left out)"
        )
    return match["path"], slice(start, stop)


def answer_matches(context: str, text: str, start: int) -> bool:
    return bool(text.strip()) and isinstance(start, int) and 0 <= start and context[start : start + len(text)] == text


def clean_examples(examples: list[dict], version_2: bool, source: str) -> list[dict]:
    """Drops answers whose ``answer_start`` does not point at their text, and answerable questions left without an
    answer; both are counted in the log. v1.1 data must not hold unanswerable questions."""
    unanswerable = sum(example.get("is_impossible", False) or not example["answers"]["text"] for example in examples)
    if unanswerable and not version_2:
        raise ValueError(
            f"SQuAD data {source!r} holds {unanswerable} unanswerable questions, which SQuAD v1.1 does "
            "not allow; use the squad_v2 task for it"
        )
    kept, skipped_answers, skipped_questions = [], 0, 0
    for example in examples:
        answers = example["answers"]
        pairs = [
            (text, start)
            for text, start in zip(answers["text"], answers["answer_start"], strict=True)
            if answer_matches(example["context"], text, start)
        ]
        skipped_answers += len(answers["text"]) - len(pairs)
        if answers["text"] and not pairs:
            skipped_questions += 1
            continue
        kept.append(
            {
                "id": example["id"],
                "title": example.get("title", ""),
                "context": example["context"],
                "question": example["question"],
                "answers": {"text": [text for text, _ in pairs], "answer_start": [start for _, start in pairs]},
            }
        )
    if skipped_answers:
        logger.warning(
            "%s: skipped %d answers whose answer_start does not point at their text (%d questions left "
            "without an answer skipped too)",
            source,
            skipped_answers,
            skipped_questions,
        )
    return kept


def load_squad(source: str | Path, split: str = "validation", version_2: bool = True) -> list[dict]:
    """Cleaned examples (see `clean_examples`) of an official JSON file (``FILE.json[a:b]``: only articles a..b-1)
    or of a Hub dataset's `split`."""
    path, articles = parse_source(source)
    if path.endswith(".json") or Path(path).exists():
        examples, name = read_squad_json(path, articles), str(source)
    else:  # a Hub dataset id such as rajpurkar/squad_v2
        import datasets

        examples, name = datasets.load_dataset(path, split=split).to_list(), f"{source} ({split} split)"
    if not examples:
        raise ValueError(f"SQuAD source {name!r} holds no question")
    return clean_examples(examples, version_2, name)


# ---------------------------------------------------------------------------------------------
# Windows and training targets
# ---------------------------------------------------------------------------------------------


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_window_settings(max_length: int, doc_stride: int) -> None:
    check_int("data.max_length", max_length, 8)
    check_int("task_options.doc_stride", doc_stride, 0)
    if doc_stride >= max_length:
        raise ValueError(
            f"task_options.doc_stride={doc_stride} must be smaller than data.max_length={max_length} "
            "(it is the number of context tokens shared by neighbouring windows)"
        )


def check_fast_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"question answering needs a fast tokenizer (character offsets of every token); "
            f"got {type(tokenizer).__name__}, which has none. Load it with use_fast=True or convert it "
            "with the tokenizers library"
        )


def fitting_examples(examples: list[dict], tokenizer, max_length: int, doc_stride: int) -> list[dict]:
    """Examples whose question leaves room for more than `doc_stride` context tokens in a window; the others are
    skipped and counted (the question is never truncated)."""
    if not examples:
        return []
    question_lengths = [
        len(ids) for ids in tokenizer([e["question"].lstrip() for e in examples], add_special_tokens=False)["input_ids"]
    ]
    room = max_length - tokenizer.num_special_tokens_to_add(pair=True)
    kept = [example for example, length in zip(examples, question_lengths, strict=True) if room - length > doc_stride]
    if len(kept) < len(examples):
        logger.warning(
            "skipped %d questions too long to leave more than doc_stride=%d context tokens in a window "
            "of max_length=%d",
            len(examples) - len(kept),
            doc_stride,
            max_length,
        )
    return kept


def answer_token_span(offsets: list, context_tokens: list[int], answer_start: int, answer_text: str):
    """First and last token of the answer's characters, or (NULL_INDEX, NULL_INDEX) when the window does not hold
    all of them."""
    answer_end = answer_start + len(answer_text)
    first, last = context_tokens[0], context_tokens[-1]
    if offsets[first][0] > answer_start or offsets[last][1] < answer_end:
        return NULL_INDEX, NULL_INDEX
    start = next(i for i in context_tokens if offsets[i][1] > answer_start)
    end = next(i for i in reversed(context_tokens) if offsets[i][0] < answer_end)
    return start, end


def prepare_features(examples: dict, tokenizer, max_length: int, doc_stride: int) -> dict:
    """Windows of a batch of examples (a dict of columns, as ``datasets.map(batched=True)`` passes it).

    Returns ``input_ids``, ``attention_mask`` (and ``token_type_ids`` if the tokenizer makes them),
    ``start_positions``/``end_positions`` (when the examples carry ``answers``; the first answer is the target),
    ``example_id`` and ``offset_mapping`` (character offsets of the context tokens, ``None`` for question and
    special tokens), unpadded."""
    from ...tokenization.windows import check_overflowing_windows

    check_overflowing_windows(tokenizer)  # a broken tokenizers release would keep only each context's first window
    encoding = tokenizer(
        [q.lstrip() for q in examples["question"]],
        examples["context"],
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    # token_type_ids only where the tokenizer emits them (a BERT folder); encoderlab's tokenizers do not.
    features = {key: encoding[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoding}
    features |= {"example_id": [], "offset_mapping": []}
    with_targets = "answers" in examples
    if with_targets:
        features["start_positions"], features["end_positions"] = [], []
    for window, example_index in enumerate(encoding["overflow_to_sample_mapping"]):
        offsets = encoding["offset_mapping"][window]
        sequence_ids = encoding.sequence_ids(window)
        context_tokens = [i for i, sequence in enumerate(sequence_ids) if sequence == 1]
        features["example_id"].append(examples["id"][example_index])
        features["offset_mapping"].append(
            [offset if sequence == 1 else None for offset, sequence in zip(offsets, sequence_ids, strict=True)]
        )
        if with_targets:
            answers = examples["answers"][example_index]
            start, end = (
                answer_token_span(offsets, context_tokens, answers["answer_start"][0], answers["text"][0])
                if answers["text"]
                else (NULL_INDEX, NULL_INDEX)
            )
            features["start_positions"].append(start)
            features["end_positions"].append(end)
    return features


def features_dataset(examples: list[dict], tokenizer, max_length: int, doc_stride: int):
    """A `datasets.Dataset` of the windows of `examples` (questions that cannot fit are skipped and logged)."""
    import datasets

    check_fast_tokenizer(tokenizer)
    check_window_settings(max_length, doc_stride)
    examples = fitting_examples(examples, tokenizer, max_length, doc_stride)
    columns = {key: [example[key] for example in examples] for key in ("id", "question", "context")}
    if examples and "answers" in examples[0]:
        columns["answers"] = [example["answers"] for example in examples]
    raw = datasets.Dataset.from_dict(columns)
    return raw.map(
        prepare_features,
        batched=True,
        remove_columns=raw.column_names,
        desc="SQuAD windows",
        fn_kwargs=dict(tokenizer=tokenizer, max_length=max_length, doc_stride=doc_stride),
    )


# ---------------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------------


def best_spans(start_logits, end_logits, offsets: list, max_answer_length: int, n_best: int):
    """The `n_best` highest-scoring valid (score, start, end) token spans of one window, best first.

    Valid: both tokens in the context (offsets not None), ``start <= end < start + max_answer_length``. The scores
    ``start_logits[s] + end_logits[e]`` of every valid pair are laid out as a (tokens, max_answer_length) band
    (row s, column e - s), so the n best are exact, not a top-k-starts x top-k-ends heuristic."""
    length = len(offsets)
    start_logits = np.asarray(start_logits, dtype=np.float64)[:length]
    end_logits = np.asarray(end_logits, dtype=np.float64)[:length]
    in_context = np.array([offset is not None for offset in offsets])
    ends = np.arange(length)[:, None] + np.arange(min(max_answer_length, length))[None, :]
    valid = (ends < length) & in_context[:, None]
    ends = np.minimum(ends, length - 1)
    valid &= in_context[ends]
    scores = np.where(valid, start_logits[:, None] + end_logits[ends], -np.inf)
    count = min(n_best, int(valid.sum()))
    if count == 0:
        return []
    flat = np.argpartition(-scores, count - 1, axis=None)[:count]
    flat = flat[np.argsort(-scores.ravel()[flat], kind="stable")]
    starts, columns = np.unravel_index(flat, scores.shape)
    return [(float(scores[s, c]), int(s), int(s + c)) for s, c in zip(starts, columns, strict=True)]


def char_span(context: str, offsets: list, start: int, end: int) -> tuple[int, int]:
    """Character span of tokens start..end, without surrounding whitespace (some tokenizers put it in offsets)."""
    first, last = offsets[start][0], offsets[end][1]
    text = context[first:last]
    first += len(text) - len(text.lstrip())
    return first, max(first, last - (len(text) - len(text.rstrip())))


def example_answer(
    context: str, windows: list, version_2: bool, n_best: int, max_answer_length: int, null_threshold: float
) -> dict:
    """The answer of one example from its windows, each ``(start_logits, end_logits, offsets)``.

    Candidates of all windows are pooled (a span seen in two windows keeps its best score); ``score`` is the
    softmax of the answer over the n-best candidates (and the null answer for v2). ``null_score`` is the lowest
    first-token score over the windows (the window most sure the answer is somewhere), as BERT's SQuAD code does;
    ``no_answer_score = null_score - best span score``, and a v2 example is answered "" when it exceeds
    `null_threshold`. ``span_text`` keeps the best span's text either way (the v2 threshold search needs it)."""
    candidates = {}
    for start_logits, end_logits, offsets in windows:
        for score, start, end in best_spans(start_logits, end_logits, offsets, max_answer_length, n_best):
            span = char_span(context, offsets, start, end)
            if span[1] > span[0] and score > candidates.get(span, -math.inf):
                candidates[span] = score
    ranked = sorted(candidates.items(), key=lambda item: -item[1])[:n_best]
    null_score = min(float(s[NULL_INDEX]) + float(e[NULL_INDEX]) for s, e, _ in windows) if windows else 0.0
    pooled = [score for _, score in ranked] + ([null_score] if version_2 else [])
    top = max(pooled, default=0.0)
    normaliser = sum(math.exp(score - top) for score in pooled)
    n_best_list = [
        {"text": context[a:b], "start": a, "end": b, "logit": score, "score": math.exp(score - top) / normaliser}
        for (a, b), score in ranked
    ]
    best = n_best_list[0] if n_best_list else None
    no_answer_score = null_score - best["logit"] if best else math.inf
    answered = best is not None and not (version_2 and no_answer_score > null_threshold)
    if answered:
        answer = {"answer": best["text"], "start": best["start"], "end": best["end"], "score": best["score"]}
    else:
        null_probability = math.exp(null_score - top) / normaliser if version_2 and pooled else 0.0
        answer = {"answer": "", "start": None, "end": None, "score": null_probability}
    return answer | {
        "span_text": best["text"] if best else "",
        "no_answer_score": no_answer_score,
        "null_score": null_score,
        "n_best": n_best_list,
    }


def postprocess(
    examples: list[dict],
    features,
    start_logits,
    end_logits,
    version_2: bool,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float = 0.0,
) -> list[dict]:
    """One answer per example (in the order of `examples`, see `example_answer`) from the logits of every window.

    `features` holds ``example_id`` and ``offset_mapping`` per window (a `datasets.Dataset` or a dict of lists);
    the logits are (windows, tokens) arrays, padded past each window's length with anything."""
    check_int("task_options.n_best", n_best, 1)
    check_int("task_options.max_answer_length", max_answer_length, 1)
    if len(start_logits) != len(features["example_id"]) or len(end_logits) != len(start_logits):
        raise ValueError(
            f"got {len(start_logits)} start and {len(end_logits)} end logit rows for "
            f"{len(features['example_id'])} windows; each window needs one of each"
        )
    windows = defaultdict(list)
    for row, (example_id, offsets) in enumerate(zip(features["example_id"], features["offset_mapping"], strict=True)):
        windows[example_id].append((start_logits[row], end_logits[row], offsets))
    return [
        {"id": example["id"]}
        | example_answer(
            example["context"], windows[example["id"]], version_2, n_best, max_answer_length, null_threshold
        )
        for example in examples
    ]


# ---------------------------------------------------------------------------------------------
# Metric
# ---------------------------------------------------------------------------------------------


def squad_metric(version_2: bool):
    """The packaged SQuAD metric module, loaded offline through `evaluate`."""
    from ...metrics import load_metric

    return load_metric("squad", "v2" if version_2 else "v1")


def score_answers(answers: list[dict], examples: list[dict], version_2: bool, null_threshold: float = 0.0) -> dict:
    """EM / F1 (v2: HasAns / NoAns splits and best_exact / best_f1 with their thresholds) of `postprocess` output.

    Examples that lost every window (a question too long to fit) count as answered ""."""
    by_id = {answer["id"]: answer for answer in answers}
    missing = {"span_text": "", "no_answer_score": math.inf}
    predictions = [{"id": e["id"], "prediction_text": by_id.get(e["id"], missing)["span_text"]} for e in examples]
    if version_2:
        for prediction in predictions:
            prediction["no_answer_score"] = by_id.get(prediction["id"], missing)["no_answer_score"]
    references = [{"id": e["id"], "answers": e["answers"]} for e in examples]
    return squad_metric(version_2).compute(
        predictions=predictions, references=references, **({"no_answer_threshold": null_threshold} if version_2 else {})
    )


def no_answer_baseline(examples: list[dict], version_2: bool) -> dict:
    """The metrics of answering "" to every question of `examples`, through the same metric as the model's answers:
    v2 scores each unanswerable question 1 and each answerable one 0, so ``exact`` = ``f1`` = the percentage of
    unanswerable questions, HasAns 0 and NoAns 100; v1 scores 0 (but for a gold answer that normalises to empty)."""
    predictions = [
        {"id": e["id"], "prediction_text": ""} | ({"no_answer_score": 0.0} if version_2 else {}) for e in examples
    ]
    references = [{"id": e["id"], "answers": e["answers"]} for e in examples]
    scores = squad_metric(version_2).compute(
        predictions=predictions, references=references, **({"no_answer_threshold": None} if version_2 else {})
    )
    return {key: value for key, value in scores.items() if not key.startswith("best_")}  # no threshold to search


# ---------------------------------------------------------------------------------------------
# The task kind of the fine-tuning registry
# ---------------------------------------------------------------------------------------------


@dataclass
class QuestionAnsweringOptions:
    """The ``task_options`` section of a SQuAD run (``--set task_options.doc_stride=64``)."""

    doc_stride: int = 128
    """Context tokens shared by neighbouring windows of a long context; must be < ``data.max_length``."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""
    n_best: int = 20
    """Candidate spans kept per example before choosing the answer."""
    null_threshold: float = 0.0
    """v2: an example is answered "" when null score - best span score > this (the metric also reports the best
    threshold on the evaluation set: best_f1_thresh)."""

    def __post_init__(self):
        check_int("task_options.doc_stride", self.doc_stride, 0)
        check_int("task_options.max_answer_length", self.max_answer_length, 1)
        check_int("task_options.n_best", self.n_best, 1)
        if (
            isinstance(self.null_threshold, bool)
            or not isinstance(self.null_threshold, (int, float))
            or not math.isfinite(self.null_threshold)
        ):
            raise ValueError(f"task_options.null_threshold must be a finite number, got {self.null_threshold!r}")


class QuestionAnsweringCollator:
    """Pads windows on the right whatever the tokenizer's padding side, so that target token positions hold;
    drops the post-processing columns (``example_id``, ``offset_mapping``) if the Trainer left them."""

    model_columns = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict:
        features = [{key: value for key, value in feature.items() if key in self.model_columns} for feature in features]
        return self.tokenizer.pad(features, padding=True, padding_side="right", return_tensors="pt")


class QuestionAnsweringKind(TaskKind):
    """`TaskKind` of extractive QA (see `encoderlab.training.finetune.tasks`)."""

    auto_class = "AutoModelForQuestionAnswering"
    pipeline_tag = "question-answering"
    options = QuestionAnsweringOptions
    label_fields = ("start_positions", "end_positions")
    baseline_name = "always no answer"
    feature_unit = "windows"

    @staticmethod
    def version_2(task) -> bool:
        return task.metric_config == "v2"

    def split_source(self, task, data, split: str):
        """(source, Hub split) of `split`: ``data.<split>`` (a JSON file, ``FILE.json[a:b]`` for some of its
        articles), else ``data.path`` (a JSON file, a folder with the official file names, or a Hub dataset id),
        else the task's Hub dataset."""
        explicit = getattr(data, split, None)
        if explicit:
            if not Path(parse_source(explicit)[0]).is_file():
                raise ValueError(
                    f"data.{split}={explicit!r} does not exist; give an official SQuAD JSON file "
                    "(FILE.json[a:b]: only its articles a..b-1)"
                )
            return str(explicit), split
        path = getattr(data, "path", None) or task.default_path
        if Path(path).is_dir():
            name = LOCAL_FILES[self.version_2(task)][split]
            if not (Path(path) / name).is_file():
                raise ValueError(
                    f"data.path={path!r} has no {name} (the official {split} file); give the file as "
                    f"data.{split}=FILE, or a JSON file or a Hub dataset id as data.path"
                )
            return str(Path(path) / name), split
        return str(path), split

    def local_files_hint(self, task) -> str:
        train, validation = LOCAL_FILES[self.version_2(task)].values()
        return (
            f"--set data.train={train} --set data.validation={validation} (the official JSON files), or "
            "--set data.path=FOLDER holding them"
        )

    def load(self, task, data):
        """(DatasetDict, {split: `SplitSource`}) of train, validation and one ``test_<stem>`` split per
        ``data.test`` file; ``data.train_limit`` / ``data.eval_limit`` / ``data.test_limit`` keep the first
        questions of a split."""
        import datasets

        sources = {split: self.split_source(task, data, split) for split in ("train", "validation")}
        for file in getattr(data, "test", None) or ():
            sources[test_file_split(parse_source(file)[0])] = (file, "test")
        splits, provenance = {}, {}
        for split, (source, hub_split) in sources.items():
            path, articles = parse_source(source)
            try:
                examples = load_squad(source, hub_split, self.version_2(task))
            except OSError as error:  # a Hub dataset offline, unreachable or not found
                raise hub_dataset_error(task, path, error, self.local_files_hint(task)) from None
            if path.endswith(".json") or Path(path).exists():
                origin = dict(
                    origin="local",
                    name=public_file_name(Path(path), getattr(data, "path", None)),
                    articles=None if articles == slice(None) else str(source)[len(path) + 1 : -1],
                )
            else:
                origin = dict(
                    origin="hub",
                    name=path,
                    config=task.hub.config if path == task.hub.dataset else None,
                    hub_split=hub_split,
                )
            kept, provenance[split] = kept_rows(examples, data, split, text=str(source), **origin)
            splits[split] = datasets.Dataset.from_list(kept)
            logger.info("%s: %d of %d questions from %s", split, len(kept), len(examples), source)
        return datasets.DatasetDict(splits), provenance

    def label_names(self, task, raw):
        return None

    def eval_splits(self, task, data, raw) -> list[str]:
        """Every split read besides train and validation: one ``test_<stem>`` per ``data.test`` file."""
        return [split for split in raw if split not in ("train", "validation")]

    def check_settings(self, task, settings) -> None:
        """The check across sections, before any data is read: ``task_options.doc_stride < data.max_length``."""
        check_window_settings(settings.data.max_length, settings.task_options.doc_stride)

    def model_config_updates(self, task, metrics: dict) -> dict:
        """Attributes to save in the fine-tuned model's config: a v2 model keeps the no-answer threshold chosen on
        the evaluation set (``best_f1_thresh``), which `predict_qa.answer_questions` and ``encoderlab predict qa``
        apply by default."""
        if not self.version_2(task):
            return {}
        thresholds = [
            value
            for key, value in metrics.items()  # "best_f1_thresh", or prefixed: "eval_best_f1_thresh"
            if key == "best_f1_thresh" or key.endswith("_best_f1_thresh")
        ]
        if not thresholds or not math.isfinite(thresholds[0]):
            return {}
        return {"qa_null_threshold": float(thresholds[0])}

    def baseline(self, task, raw_split) -> dict:
        """`no_answer_baseline` of the split's questions (those whose question could not fit count too, as in the
        model's scores)."""
        return no_answer_baseline(raw_split.to_list(), self.version_2(task))

    def preprocess(self, raw_split, tokenizer, task, settings):
        return features_dataset(
            raw_split.to_list(), tokenizer, settings.data.max_length, settings.task_options.doc_stride
        )

    def collator(self, tokenizer):
        return QuestionAnsweringCollator(tokenizer)

    def compute_metrics(self, task, raw_split, features, settings):
        examples, options, version_2 = raw_split.to_list(), settings.task_options, self.version_2(task)
        window_columns = {"example_id": features["example_id"], "offset_mapping": features["offset_mapping"]}

        def compute(eval_prediction) -> dict:
            start_logits, end_logits = eval_prediction.predictions[:2]
            answers = postprocess(
                examples,
                window_columns,
                start_logits,
                end_logits,
                version_2,
                options.n_best,
                options.max_answer_length,
                options.null_threshold,
            )
            return score_answers(answers, examples, version_2, options.null_threshold)

        return compute


SQUAD_CPU_DEFAULTS = {"train.max_steps": 150, "train.batch_size": 16, "train.lr": 1e-4, "data.max_length": 384,
                      "task_options.doc_stride": 128}  # fmt: skip
"""BERT's SQuAD windows (384 tokens sharing 128), so most contexts fit in one window and most training windows hold
their answer; 150 steps with 5 evaluations: the demo checkpoint fine-tuned on three articles' questions is best
after about 100 steps and overfits after (docs/fine-tuning.md, the CPU example)."""

for _version_2 in (False, True):
    register_task(Task(
        name="squad_v2" if _version_2 else "squad_v1", kind="qa", problem_type="question_answering", metric="squad",
        metric_config="v2" if _version_2 else "v1", main_metric="f1",
        description=("SQuAD 2.0 extractive QA with unanswerable questions (EM, F1, HasAns/NoAns, best threshold)"
                     if _version_2 else "SQuAD 1.1 extractive QA (EM, F1)"),
        hub=HubLayout(dataset=HUB_DATASETS[_version_2], config=HUB_CONFIGS[_version_2]),
        default_path=HUB_DATASETS[_version_2],
        cpu_defaults=SQUAD_CPU_DEFAULTS,
    ))  # fmt: skip
