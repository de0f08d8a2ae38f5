"""Regression metrics as an `evaluate` module: Pearson r, Spearman rho (scipy) and MSE (scikit-learn).

A constant prediction has no ranking: its correlations are reported as 0.0 rather than NaN.
"""

import math

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import mean_squared_error


def _correlation(statistic) -> float:
    return 0.0 if math.isnan(statistic) else float(statistic)


class Regression(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Pearson and Spearman correlation and mean squared error",
            citation="",
            inputs_description="predictions, references: one float per example",
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
        )

    def _compute(self, predictions, references):
        if len(predictions) < 2:
            raise ValueError(f"regression metrics need at least 2 examples, got {len(predictions)}")
        constant = min(predictions) == max(predictions) or min(references) == max(references)
        return {
            "pearson": 0.0 if constant else _correlation(pearsonr(predictions, references).statistic),
            "spearmanr": 0.0 if constant else _correlation(spearmanr(predictions, references).statistic),
            "mse": float(mean_squared_error(references, predictions)),
        }
