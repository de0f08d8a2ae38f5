"""The summary statistics now live in `encoderlab.results.stats`; this name stays for code that imports it here."""

from ..results.stats import (  # noqa: F401
    SIGNIFICANCE,
    mean_sd,
    mean_sd_cell,
    significance_mark,
    welch_entry,
    welch_interval,
    welch_p,
    welch_test,
)
