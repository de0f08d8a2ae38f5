"""Classification metrics as an `evaluate` module (scikit-learn).

``default``: one class id per example -> accuracy, macro-F1 over the classes present in either input.
``multilabel``: one 0/1 vector per example -> subset accuracy (every label right), micro-F1, macro-F1.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, f1_score

CONFIGS = ("default", "multilabel")


class Classification(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIGS:
            raise ValueError(f"classification metric config_name={self.config_name!r}; allowed: {list(CONFIGS)}")
        value = datasets.Value("int64")
        feature = datasets.Sequence(value) if self.config_name == "multilabel" else value
        return evaluate.MetricInfo(
            description="accuracy and F1 for single- and multi-label classification",
            citation="",
            inputs_description="predictions, references: class ids, or 0/1 vectors for multilabel",
            features=datasets.Features({"predictions": feature, "references": feature}),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if self.config_name == "multilabel":
            return {
                "accuracy": float(accuracy_score(references, predictions)),
                "micro_f1": float(f1_score(references, predictions, average="micro", zero_division=0.0)),
                "macro_f1": float(f1_score(references, predictions, average="macro", zero_division=0.0)),
            }
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "macro_f1": float(f1_score(references, predictions, average="macro", zero_division=0.0)),
        }
