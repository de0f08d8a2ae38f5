"""SQuAD v1.1 / v2.0 exact match and token F1 as an `evaluate` metric module.

Loads offline: ``evaluate.load(encoderlab.metrics.squad.METRIC_PATH, "v2")``. The module is self-contained
(evaluate copies this one file into its cache), so it imports nothing from encoderlab.

Each version follows its official evaluation script. Answers are normalised (lowercase, punctuation and the articles
a/an/the removed, whitespace collapsed); exact match and token F1 of a question are the maxima over its gold answers.

- v1 (``exact_match``, ``f1``): every gold answer counts, even one that normalises to empty ("The" equals the
  prediction ""), and a token F1 with no shared token is 0, so "" against a gold "the" scores F1 0. Every question
  needs a gold answer.
- v2 (``exact``, ``f1``, HasAns / NoAns splits): gold answers that normalise to empty are dropped and a question
  left without one is answered only by ""; a token F1 with an empty side is 1 when both sides are empty. A question
  counts as answerable when it has any gold answer. Predictions carry the best span's text and a ``no_answer_score``
  (higher means more likely unanswerable, e.g. the null score minus the best span score). A question whose score is
  above the threshold is predicted unanswerable and scores 1 when it has no gold answer, else 0.

The best threshold (v2 ``best_exact`` / ``best_f1`` and their ``_thresh``) is searched as the official script
does, by switching questions from "unanswerable" to their span in order of increasing ``no_answer_score``, with
one difference that makes the saved threshold honest: candidates are only thresholds that can be applied. Questions
with equal scores switch together (a threshold cannot split them, while the official search may report a score
reached halfway through a tie), and "every question unanswerable" is the largest float below the lowest score.
Among thresholds reaching the same best score the lowest is kept. ``best_*`` is the score computed by applying
``best_*_thresh``, so ``compute(..., no_answer_threshold=best_f1_thresh)["f1"] == best_f1`` exactly. (A span text
that normalises to empty, such as "the", on an unanswerable question counts in the search as the empty answer it
scores as, where the official search counts it wrong.) Without ties this is the official search, except that the
official script reports threshold 0.0 when no switch helps.
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
    predictions: list of {"id": str, "prediction_text": str} (v2 also "no_answer_score": float, not NaN).
    references: list of {"id": str, "answers": {"text": list of str, "answer_start": list of int}};
        v2 questions without an answer have empty lists (v1 questions must have one).
    no_answer_threshold (v2): a question is predicted unanswerable when its no_answer_score is above this
        (default 0.0, the null-score-versus-best-span rule); None uses the prediction texts as given.
Returns:
    v1: exact_match, f1 (percentages), total. v2: exact, f1, total, HasAns_* / NoAns_*, best_exact,
    best_exact_thresh, best_f1, best_f1_thresh.
"""

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_TIE_TOLERANCE = 1e-9
"""Running totals closer than this are the same score (float sums of F1 values in another order)."""


def normalize_answer(text: str) -> str:
    """The official normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version_2: bool = True) -> float:
    """Token F1; v2: an empty side matches only another empty side; v1: no shared token is 0, empty or not."""
    predicted_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not predicted_tokens or not gold_tokens):
        return float(predicted_tokens == gold_tokens)
    shared = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_texts(answers: dict, version_2: bool) -> list[str]:
    """v1: every gold answer. v2: those that survive normalisation, [""] when none does (unanswerable)."""
    if not version_2:
        return list(answers["text"])
    return [text for text in answers["text"] if normalize_answer(text)] or [""]


def question_scores(prediction: str, answers: dict, version_2: bool = True) -> tuple[int, float]:
    golds = gold_texts(answers, version_2)
    return (
        max(exact_match(prediction, gold) for gold in golds),
        max(token_f1(prediction, gold, version_2) for gold in golds),
    )


def apply_threshold(raw: dict, no_answer_scores: dict, has_answer: dict, threshold: float) -> dict:
    """Per-question scores at `threshold`: a question scored above it is predicted unanswerable, which is right
    (1) exactly when it has no gold answer; the others keep the score of their span text."""
    return {
        qid: float(not has_answer[qid]) if no_answer_scores[qid] > threshold else score for qid, score in raw.items()
    }


def best_threshold(raw: dict, no_answer_scores: dict, has_answer: dict) -> float:
    """The lowest applicable threshold on no_answer_score that maximises the total of `apply_threshold`.

    From "every question unanswerable", questions switch to their span in order of increasing score; the total is
    compared only after the last question of a tie, since one threshold switches all of them."""
    order = sorted(raw, key=lambda qid: no_answer_scores[qid])
    total = float(sum(not has_answer[qid] for qid in raw))
    best_total, best = total, math.nextafter(no_answer_scores[order[0]], -math.inf)
    for position, qid in enumerate(order):
        total += raw[qid] - float(not has_answer[qid])
        tie_continues = position + 1 < len(order) and no_answer_scores[order[position + 1]] == no_answer_scores[qid]
        if not tie_continues and total > best_total + _TIE_TOLERANCE:
            best_total, best = total, no_answer_scores[qid]
    return best


def _split(name: str, qids: list, exact: dict, f1: dict) -> dict:
    if not qids:
        return {}
    return {
        f"{name}_exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
        f"{name}_f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
        f"{name}_total": len(qids),
    }


def v1_scores(texts: dict, golds: dict) -> dict:
    unanswerable = [qid for qid in texts if not golds[qid]["text"]]
    if unanswerable:
        raise ValueError(
            f"SQuAD v1.1 questions need a gold answer; {len(unanswerable)} have none (ids "
            f"{unanswerable[:5]}); score unanswerable questions with config 'v2'."
        )
    exact, f1 = {}, {}
    for qid, text in texts.items():
        exact[qid], f1[qid] = question_scores(text, golds[qid], version_2=False)
    scores = _split("all", list(texts), exact, f1)
    return {"exact_match": scores["all_exact"], "f1": scores["all_f1"], "total": scores["all_total"]}


def v2_scores(texts: dict, golds: dict, no_answer_scores: dict, threshold: float | None) -> dict:
    nan = [qid for qid, score in no_answer_scores.items() if math.isnan(score)]
    if nan:
        raise ValueError(f"no_answer_score must be a number, got NaN for {len(nan)} questions (ids {nan[:5]}).")
    raw_exact, raw_f1 = {}, {}
    for qid, text in texts.items():
        raw_exact[qid], raw_f1[qid] = question_scores(text, golds[qid])
    has_answer = {qid: bool(golds[qid]["text"]) for qid in texts}  # as the official script: any gold answer

    def at(threshold):
        if threshold is None:
            return raw_exact, raw_f1
        return tuple(apply_threshold(raw, no_answer_scores, has_answer, threshold) for raw in (raw_exact, raw_f1))

    exact, f1 = at(threshold)
    all_scores = _split("all", list(texts), exact, f1)
    results = {"exact": all_scores["all_exact"], "f1": all_scores["all_f1"], "total": all_scores["all_total"]}
    results |= _split("HasAns", [q for q in texts if has_answer[q]], exact, f1)
    results |= _split("NoAns", [q for q in texts if not has_answer[q]], exact, f1)
    for key, raw in (("exact", raw_exact), ("f1", raw_f1)):
        best = best_threshold(raw, no_answer_scores, has_answer)
        # Reported as applied, through the same code as "exact" / "f1": the saved threshold reproduces it.
        results[f"best_{key}"] = _split("all", list(texts), *at(best))[f"all_{key}"]
        results[f"best_{key}_thresh"] = best
    return results


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Squad(evaluate.Metric):
    def _info(self):
        prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
        if self.config_name == "v2":
            prediction["no_answer_score"] = datasets.Value("float64")
        elif self.config_name not in ("default", "v1"):
            raise ValueError(f"config_name must be 'v1' or 'v2', got {self.config_name!r}.")
        reference = {
            "id": datasets.Value("string"),
            "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
        }
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": prediction, "references": reference}),
        )

    def _compute(self, predictions, references, no_answer_threshold=0.0):
        golds = {reference["id"]: reference["answers"] for reference in references}
        missing = [p["id"] for p in predictions if p["id"] not in golds]
        if missing or len(predictions) != len(golds):
            raise ValueError(
                f"predictions and references must have the same question ids; {len(predictions)} "
                f"predictions for {len(golds)} references, unknown ids {missing[:5]}."
            )
        texts = {p["id"]: p["prediction_text"] for p in predictions}
        if self.config_name != "v2":
            return v1_scores(texts, golds)
        no_answer_scores = {p["id"]: p["no_answer_score"] for p in predictions}
        return v2_scores(texts, golds, no_answer_scores, no_answer_threshold)
