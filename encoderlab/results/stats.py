"""Summary statistics of the paper experiments and analyses: mean and sd over seeds, Welch's t-test and its marks."""

import statistics

# Imported inside functions (cost): scipy, so that --help and check() answer without it (encoderlab/cli.py).

SIGNIFICANCE = ((0.001, "***"), (0.01, "**"), (0.05, "*"))
"""(p threshold, mark), strictest first."""


def mean_sd(values):
    """(mean, sample sd) of `values`; sd 0 for a single value."""
    values = list(values)
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_sd_cell(values, digits=3):
    """``"0.512 ± 0.004"``: a table cell of mean and sd."""
    mean, sd = mean_sd(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def seeds_cell(values, digits=2):
    """Mean ± sd over seeds, a single value alone (one run has no sd), ``"-"`` for none."""
    values = list(values)
    if not values:
        return "-"
    return f"{values[0]:.{digits}f}" if len(values) == 1 else mean_sd_cell(values, digits)


def welch_test(a, b):
    """scipy's two-sided Welch's t-test of `a` against `b`; None when a group has fewer than two values."""
    from scipy.stats import ttest_ind

    return ttest_ind(a, b, equal_var=False) if len(a) >= 2 and len(b) >= 2 else None


def welch_p(a, b):
    """Two-sided Welch's t-test p-value; NaN when a group has fewer than two values or both have no variance."""
    test = welch_test(a, b)
    return float("nan") if test is None else float(test.pvalue)


def welch_interval(a, b, confidence=0.95):
    """Welch's confidence interval for mean(a) - mean(b); NaN ends when a group has fewer than two values."""
    test = welch_test(a, b)
    if test is None:
        return float("nan"), float("nan")
    interval = test.confidence_interval(confidence)
    return float(interval.low), float(interval.high)


def significance_mark(p):
    """``***`` / ``**`` / ``*`` below 0.001 / 0.01 / 0.05, ``n.s.`` above; empty when untestable (NaN)."""
    if p != p:
        return ""
    return next((mark for threshold, mark in SIGNIFICANCE if p < threshold), "n.s.")


def welch_entry(values_a, values_b, **fields):
    """One comparison row: `fields`, both means, their difference (a - b), Welch's p and its mark."""
    p = welch_p(values_a, values_b)
    mean_a, mean_b = statistics.mean(values_a), statistics.mean(values_b)
    return {
        **fields,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "difference": mean_a - mean_b,
        "p_value": p,
        "mark": significance_mark(p),
    }
