"""SQuAD v1.1 / v2.0 exact match and token F1 as an `evaluate` metric module.

Loads offline: ``evaluate.load(encoderlab.metrics.squad.METRIC_PATH, "v2")``. The module is self-contained
(evaluate copies this one file into its cache), so it imports nothing from encoderlab.

Follows the official evaluation scripts: answers are normalised (lowercase, punctuation and the articles a/an/the
removed, whitespace collapsed); exact match and token F1 of a question are the maxima over its gold answers; a
question with no gold answer (v2) scores 1 only when the prediction is empty. v2 also reports the HasAns / NoAns
splits and the best no-answer threshold: predictions carry the best span's text and a ``no_answer_score`` (higher
means more likely unanswerable, e.g. the null score minus the best span score); a question counts as predicted
unanswerable when its score is above the threshold, and best_exact / best_f1 are the best scores over every
threshold, with the threshold that reaches them.
"""

import math
import re
import string
from collections import Counter

import datasets
import evaluate

_DESCRIPTION = __doc__
_CITATION = "Rajpurkar et al. 2016 (SQuAD), 2018 (Know What You Don't Know: Unanswerable Questions for SQuAD)."
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of {"id": str, "prediction_text": str} (v2 also "no_answer_score": float).
    references: list of {"id": str, "answers": {"text": list of str, "answer_start": list of int}};
        v2 questions without an answer have empty lists.
    no_answer_threshold (v2): a question is predicted unanswerable when its no_answer_score is above this
        (default 0.0, the null-score-versus-best-span rule); None uses the prediction texts as given.
Returns:
    exact, f1 (percentages), total; v2 also HasAns_* / NoAns_* and best_exact, best_exact_thresh, best_f1,
    best_f1_thresh.
"""

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    predicted_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted_tokens or not gold_tokens:  # an empty side matches only another empty side
        return float(predicted_tokens == gold_tokens)
    shared = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_texts(answers: dict) -> list[str]:
    """Gold answers that survive normalisation; [""] for an unanswerable question (as the v2 script does)."""
    texts = [text for text in answers["text"] if normalize_answer(text)]
    return texts or [""]


def question_scores(prediction: str, answers: dict) -> tuple[int, float]:
    golds = gold_texts(answers)
    return max(exact_match(prediction, gold) for gold in golds), max(token_f1(prediction, gold) for gold in golds)


def best_threshold(no_answer_scores: dict, raw_scores: dict, has_answer: dict, predicted_empty: dict):
    """The threshold on no_answer_score that maximises the total score, as the official v2 script searches it.

    Starting from "every question unanswerable" (each NoAns question scores 1), questions are switched to their
    span prediction in order of increasing no_answer_score; the best running total and the score at which it is
    reached are returned (as a percentage and a threshold)."""
    total = sum(not has_answer[qid] for qid in raw_scores)
    # "Every question unanswerable" is any threshold below the lowest score: the largest float below it.
    best_total, best_thresh = total, math.nextafter(min(no_answer_scores[qid] for qid in raw_scores), -math.inf)
    for qid in sorted(raw_scores, key=lambda qid: no_answer_scores[qid]):
        if has_answer[qid]:
            total += raw_scores[qid]
        elif not predicted_empty[qid]:
            total -= 1
        if total > best_total:
            best_total, best_thresh = total, no_answer_scores[qid]
    return 100.0 * best_total / len(raw_scores), best_thresh


def _split(name: str, qids: list, exact: dict, f1: dict) -> dict:
    if not qids:
        return {}
    return {f"{name}_exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            f"{name}_f1": 100.0 * sum(f1[q] for q in qids) / len(qids), f"{name}_total": len(qids)}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Squad(evaluate.Metric):
    def _info(self):
        prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
        if self.config_name == "v2":
            prediction["no_answer_score"] = datasets.Value("float64")
        elif self.config_name not in ("default", "v1"):
            raise ValueError(f"config_name must be 'v1' or 'v2', got {self.config_name!r}.")
        reference = {"id": datasets.Value("string"),
                     "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                   "answer_start": datasets.Value("int32")})}
        return evaluate.MetricInfo(description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
                                   features=datasets.Features({"predictions": prediction, "references": reference}))

    def _compute(self, predictions, references, no_answer_threshold=0.0):
        golds = {reference["id"]: reference["answers"] for reference in references}
        missing = [p["id"] for p in predictions if p["id"] not in golds]
        if missing or len(predictions) != len(golds):
            raise ValueError(f"predictions and references must have the same question ids; {len(predictions)} "
                             f"predictions for {len(golds)} references, unknown ids {missing[:5]}.")
        version_2 = self.config_name == "v2"
        texts = {p["id"]: p["prediction_text"] for p in predictions}
        if version_2 and no_answer_threshold is not None:
            texts = {p["id"]: "" if p["no_answer_score"] > no_answer_threshold else p["prediction_text"]
                     for p in predictions}
        exact, f1 = {}, {}
        for qid, text in texts.items():
            exact[qid], f1[qid] = question_scores(text, golds[qid])
        results = _split("all", list(texts), exact, f1)
        results = {"exact": results["all_exact"], "f1": results["all_f1"], "total": results["all_total"]}
        if not version_2:
            return results
        has_answer = {qid: bool(golds[qid]["text"]) for qid in texts}  # as the official script: any gold answer
        results |= _split("HasAns", [q for q in texts if has_answer[q]], exact, f1)
        results |= _split("NoAns", [q for q in texts if not has_answer[q]], exact, f1)
        # The threshold search switches questions between "" and their span text, so it scores the span texts.
        raw = {p["id"]: p["prediction_text"] for p in predictions}
        raw_exact, raw_f1 = {}, {}
        for qid, text in raw.items():
            raw_exact[qid], raw_f1[qid] = question_scores(text, golds[qid])
        no_answer_scores = {p["id"]: p["no_answer_score"] for p in predictions}
        empty = {qid: not text for qid, text in raw.items()}
        results["best_exact"], results["best_exact_thresh"] = best_threshold(no_answer_scores, raw_exact,
                                                                             has_answer, empty)
        results["best_f1"], results["best_f1_thresh"] = best_threshold(no_answer_scores, raw_f1, has_answer, empty)
        return results
