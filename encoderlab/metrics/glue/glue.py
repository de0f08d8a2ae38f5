"""GLUE metrics as an `evaluate` module (scikit-learn and scipy do the arithmetic).

Configs: cola -> matthews_correlation; stsb -> pearson, spearmanr; mrpc, qqp -> accuracy, f1 (of the positive
class 1); sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli -> accuracy.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

ACCURACY_TASKS = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli")
CONFIGS = ("cola", "stsb", "mrpc", "qqp", *ACCURACY_TASKS)


class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIGS:
            raise ValueError(f"glue metric config_name={self.config_name!r}; allowed: {list(CONFIGS)}")
        dtype = "float64" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description="GLUE task metrics (Wang et al., 2019)",
            citation="Wang et al., GLUE: A Multi-Task Benchmark and Analysis Platform for NLU, ICLR 2019",
            inputs_description="predictions, references: one class id (stsb: one score) per example",
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
        )

    def _compute(self, predictions, references):
        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name == "stsb":
            return {
                "pearson": float(pearsonr(predictions, references).statistic),
                "spearmanr": float(spearmanr(predictions, references).statistic),
            }
        accuracy = {"accuracy": float(accuracy_score(references, predictions))}
        if self.config_name in ("mrpc", "qqp"):
            return {**accuracy, "f1": float(f1_score(references, predictions))}
        return accuracy
