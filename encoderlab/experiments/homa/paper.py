"""The HOMA paper's Table 2 (Amiraslani and Gao), for the summary to show beside the sweep's own numbers.

Single numbers as the paper prints them: trained to early stopping on one A100, no spread over seeds given. Only the
columns this sweep also measures: the paper has no NEW364 column, and its CASP12 and TS115 test sets are not in the
TAPE files the sweep reads."""

PAPER_TABLE2 = {  # Table-2 row label -> {column header of `arms.COLUMNS`: value}
    "Pairwise-2D": {"CB513 F1": 0.5321, "CB513 Acc": 0.5577, "Fluorescence ρ": 0.6647, "Stability ρ": 0.6221},
    "Blockwise-2D": {"CB513 F1": 0.6202, "CB513 Acc": 0.6308, "Fluorescence ρ": 0.6998, "Stability ρ": 0.6509},
    "Linear-2D": {"CB513 F1": 0.4910, "CB513 Acc": 0.5162, "Fluorescence ρ": 0.6821, "Stability ρ": 0.5439},
    "HOMA (w = 3)": {"CB513 F1": 0.6261, "CB513 Acc": 0.6397, "Fluorescence ρ": 0.7016, "Stability ρ": 0.6646},
    "HOMA (w = 5)": {"CB513 F1": 0.6263, "CB513 Acc": 0.6432, "Fluorescence ρ": 0.7116, "Stability ρ": 0.7152},
    "HOMA (w = 7)": {"CB513 F1": 0.6336, "CB513 Acc": 0.6504, "Fluorescence ρ": 0.7388, "Stability ρ": 0.7106},
}  # fmt: skip
PAPER_COLUMNS = tuple(dict.fromkeys(column for values in PAPER_TABLE2.values() for column in values))


def paper_value(label: str, column: str) -> float | None:
    """The paper's number for a Table-2 row label (``arm_label``) and column header; None where it has none."""
    return PAPER_TABLE2.get(label, {}).get(column)
