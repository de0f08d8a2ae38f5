"""`evaluate` metric modules shipped inside the package, so that they load offline.

``evaluate.load("accuracy")`` fetches a script from the Hub; these modules are plain files in this folder, loaded
by path: ``evaluate.load(metric_path("glue"), config_name="mrpc")``. Every module computes its numbers with
scikit-learn or scipy.

| module | configs | returns |
|---|---|---|
| ``glue`` | cola, sst2, mrpc, qqp, stsb, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli | its GLUE metrics |
| ``classification`` | default, multilabel | accuracy and macro-F1 (multilabel: subset accuracy, micro/macro-F1) |
| ``regression`` | default | Pearson r, Spearman rho, MSE |
| ``sequence_labeling`` | default, ss3 | per-token accuracy (ss3: ``q3``) and macro-F1; reference -100 is skipped |
"""

from pathlib import Path

import evaluate

METRICS_DIR = Path(__file__).parent


def available_metrics() -> list[str]:
    return sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())


def metric_path(name: str) -> str:
    """The module file of metric `name` (the path `evaluate.load` takes)."""
    path = METRICS_DIR / name / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"metric={name!r} is not a metric module of encoderlab; allowed: {available_metrics()}")
    return str(path)


def load_metric(name: str, config_name: str | None = None):
    """``evaluate.load`` of the packaged module `name` (offline; never the Hub)."""
    return evaluate.load(metric_path(name), config_name=config_name or "default")
