"""Per-token classification metrics as an `evaluate` module (scikit-learn).

Inputs are flat: one predicted and one reference class id per token. Tokens whose reference is -100 (special
tokens, padding, unresolved residues) are skipped. ``default`` returns accuracy and macro-F1; ``ss3`` (protein
secondary structure, 3 states) names the accuracy ``q3`` as TAPE does. Macro-F1 averages over the classes
``range(num_labels)`` when ``num_labels`` is given, else over the classes present.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, f1_score

IGNORE_INDEX = -100
CONFIGS = ("default", "ss3")


class SequenceLabeling(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIGS:
            raise ValueError(f"sequence_labeling metric config_name={self.config_name!r}; allowed: {list(CONFIGS)}")
        return evaluate.MetricInfo(
            description="token accuracy (Q3 for secondary structure) and macro-F1, ignoring label -100",
            citation="",
            inputs_description="predictions, references: one class id per token (flattened); num_labels: optional",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, num_labels=None):
        predictions, references = np.asarray(predictions), np.asarray(references)
        keep = references != IGNORE_INDEX
        predictions, references = predictions[keep], references[keep]
        if references.size == 0:
            raise ValueError("no labelled token to score (every reference is -100)")
        if self.config_name == "ss3" and num_labels is None:
            num_labels = 3
        classes = None if num_labels is None else list(range(num_labels))
        accuracy_name = "q3" if self.config_name == "ss3" else "accuracy"
        return {
            accuracy_name: float(accuracy_score(references, predictions)),
            "macro_f1": float(f1_score(references, predictions, labels=classes, average="macro", zero_division=0.0)),
        }
