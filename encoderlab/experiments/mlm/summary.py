"""The MLM comparison's statistics and Markdown summary from the rows of its results CSV: mean and sd over seeds per
arm, Welch's t-tests between attention variants and between rope and rope-off, and the same along the
context-extension axes (training length x RoPE scaling)."""

import statistics
from itertools import combinations

from ...results.stats import mean_sd, welch_entry
from ...results.tables import markdown_lines
from ...training.metrics import METRIC_NAMES
from .arms import LENGTHS, VARIANTS, split_variant, variant_of
from .options import POSITION_ARMS, SCALINGS

METRIC_LABELS = {"mlm_loss": "loss", "accuracy": "accuracy", "micro_f1": "micro-F1", "mcc": "MCC"}


def groups(rows, split="test"):
    """{(attention variant, positions): {"<length>_<metric>": [value per seed]}}."""
    grouped = {}
    for row in rows:
        values = grouped.setdefault((variant_of(row), row["positions"]), {})
        for length in LENGTHS:
            for name in METRIC_NAMES:
                values.setdefault(f"{length}_{name}", []).append(float(row[f"{split}_{length}_{name}"]))
    return grouped


def compared_pairs(grouped):
    """(a, b) group pairs: every two attention variants within a position arm (later one in `VARIANTS` first, so
    dual triangle is compared against the others, and head_groups against channel_halves), and rope vs rope-off
    within an attention variant."""
    attentions = [a for a in reversed(VARIANTS) if any(key[0] == a for key in grouped)]
    arms = [p for p in POSITION_ARMS if any(key[1] == p for key in grouped)]
    pairs = [((a, p), (b, p)) for p in arms for a, b in combinations(attentions, 2)]
    pairs += [((a, "rope"), (a, "rope-off")) for a in attentions]
    return [(a, b) for a, b in pairs if a in grouped and b in grouped]


def comparisons(rows):
    """One dict per compared pair, length and metric: means, difference a - b, Welch p-value and mark."""
    grouped = groups(rows)
    results = []
    for a, b in compared_pairs(grouped):
        for length in LENGTHS:
            for name in METRIC_NAMES:
                results.append(
                    welch_entry(
                        grouped[a][f"{length}_{name}"],
                        grouped[b][f"{length}_{name}"],
                        a="/".join(a),
                        b="/".join(b),
                        length=length,
                        metric=name,
                    )
                )
    return results


def group_order(grouped):
    return sorted(grouped, key=lambda key: (list(POSITION_ARMS).index(key[1]), VARIANTS.index(key[0])))


def table_rows(rows):
    """Mean and sd over seeds of every test metric, per (attention, routing, positions)."""
    grouped = groups(rows)
    table = []
    for key in group_order(grouped):
        entry = {**split_variant(key[0]), "positions": key[1], "seeds": len(grouped[key]["short_accuracy"])}
        for column, values in grouped[key].items():
            entry[f"{column}_mean"], entry[f"{column}_sd"] = mean_sd(values)
        table.append(entry)
    return table


def mean_sd_cells(entry, columns):
    """``"0.512 ± 0.004"`` table cells of an aggregated entry, one per (length, metric) column."""
    return [f"{entry[f'{length}_{name}_mean']:.3f} ± {entry[f'{length}_{name}_sd']:.3f}" for length, name in columns]


def column_labels(columns):
    """``"accuracy 1x"``: the table header of each (length, metric) column."""
    return [f"{METRIC_LABELS[name]} {LENGTHS[length]}" for length, name in columns]


def welch_cell(entry):
    """``"+0.012 (p=0.03 *)"``: a table cell of one Welch comparison (difference a - b, p-value, mark)."""
    return f"{entry['difference']:+.3f} (p={entry['p_value']:.2g} {entry['mark']})".replace(" )", ")")


def floor_cell(rows, length):
    """Mean copy-or-unigram floor of `rows` at `length`, or "missing" where a row lacks it (runs and CSVs from
    before the floor, whose ``floor_*`` cells are empty or absent)."""
    values = [row.get(f"floor_{length}", "") for row in rows]
    if any(value in ("", None) for value in values):
        return "missing"
    return f"{statistics.mean(float(value) for value in values):.3f}"


def summary_markdown(rows, stats):
    metric_columns = [(length, name) for length in LENGTHS for name in METRIC_NAMES]
    first = rows[0]
    lines = [
        "# MLM comparison",
        "",
        f"{len(rows)} runs (setup {first['setup']}), each {int(first['tokens_seen']):,} non-padding tokens in "
        f"{first['steps']} steps (first run; seeds differ slightly, as the document split follows the seed).",
        "",
        "## Test metrics on masked positions, mean ± sd over seeds",
        "",
        "1x = the training length, 4x = four times it. Loss: lower is better. Micro-F1 equals accuracy for "
        "single-label prediction; it is listed because the paper does.",
        "",
    ]
    lines += markdown_lines(
        ["attention", "routing", "positions", "seeds", *column_labels(metric_columns)],
        [
            [
                entry["attention"],
                entry["routing"],
                entry["positions"],
                entry["seeds"],
                *mean_sd_cells(entry, metric_columns),
            ]
            for entry in table_rows(rows)
        ],
    )
    unigram = {length: statistics.mean(float(row[f"unigram_{length}"]) for row in rows) for length in LENGTHS}
    lines += [
        "",
        f"Unigram baseline (always the most frequent training token), test accuracy: {unigram['short']:.3f} (1x), "
        f"{unigram['long']:.3f} (4x).",
        f"Copy-or-unigram floor (on the models' own test masks: copy every input that is not the mask token, "
        f"predict the most frequent training token at the mask tokens), test accuracy: {floor_cell(rows, 'short')} "
        f"(1x), {floor_cell(rows, 'long')} (4x).",
        "",
        "## Welch's t-tests (two-sided, over seeds)",
        "",
        "Each cell: mean(a) - mean(b), p-value and mark (* p<0.05, ** p<0.01, *** p<0.001, n.s. p>=0.05).",
        "",
    ]
    by_pair = {}
    for entry in stats:
        by_pair.setdefault((entry["a"], entry["b"], entry["length"]), {})[entry["metric"]] = entry
    lines += markdown_lines(
        ["a", "b", "length", *(METRIC_LABELS[name] for name in METRIC_NAMES)],
        [
            [a, b, LENGTHS[length], *(welch_cell(metrics[name]) for name in METRIC_NAMES)]
            for (a, b, length), metrics in by_pair.items()
        ],
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- context extension axes


def setting_of(row):
    """(training length, evaluation-time RoPE scaling) of a row; rows of older sweeps have neither column."""
    return str(row.get("train_len") or ""), row.get("scaling") or "none"


def setting_label(setting):
    train_len, scaling = setting
    return f"L{train_len} {scaling}" if train_len else scaling


def settings(rows):
    """The settings in the rows, by training length, then scaling in `SCALINGS` order: the first, the shortest
    training length without scaling, is the reference (the paper's Figures 3/4 setting)."""
    return sorted({setting_of(row) for row in rows}, key=lambda s: (int(s[0] or 0), SCALINGS.index(s[1])))


def reference_rows(rows):
    reference = settings(rows)[0]
    return [row for row in rows if setting_of(row) == reference]


def welch_entries(rows_a, rows_b, **fields):
    """Welch's test of two groups of rows on every test metric at 1x and 4x: one dict per length and metric."""
    entries = []
    for length in LENGTHS:
        for name in METRIC_NAMES:
            a = [float(row[f"test_{length}_{name}"]) for row in rows_a]
            b = [float(row[f"test_{length}_{name}"]) for row in rows_b]
            entries.append(welch_entry(a, b, **fields, length=length, metric=name))
    return entries


def context_groups(rows):
    """{(attention variant, positions, setting): [rows]} in display order."""
    grouped = {}
    for row in rows:
        grouped.setdefault((variant_of(row), row["positions"], setting_of(row)), []).append(row)
    order = settings(rows)
    return dict(
        sorted(
            grouped.items(),
            key=lambda item: (
                list(POSITION_ARMS).index(item[0][1]),
                order.index(item[0][2]),
                VARIANTS.index(item[0][0]),
            ),
        )
    )


def context_comparisons(rows):
    """Welch's tests along the context-extension axes:

    - ``attention``: within each position arm and setting, every two attention variants (later in `VARIANTS`
      first), e.g. dual triangle + YaRN against bidirectional + YaRN, or head_groups against channel_halves;
    - ``setting``: within each attention type and position arm, every other setting against the reference
      (shortest training length, no scaling), e.g. what YaRN or a longer training length does to one model.
    """
    grouped = context_groups(rows)
    reference = settings(rows)[0]
    attentions = [a for a in reversed(VARIANTS) if any(key[0] == a for key in grouped)]
    cells = list(dict.fromkeys((positions, setting) for _, positions, setting in grouped))
    entries = []
    for positions, setting in cells:
        for a, b in combinations(attentions, 2):
            if (a, positions, setting) in grouped and (b, positions, setting) in grouped:
                entries += welch_entries(
                    grouped[(a, positions, setting)],
                    grouped[(b, positions, setting)],
                    test="attention",
                    group=f"{positions}, {setting_label(setting)}",
                    a=a,
                    b=b,
                )
    for (attention, positions, setting), group_rows in grouped.items():
        if setting != reference and (attention, positions, reference) in grouped:
            entries += welch_entries(
                group_rows,
                grouped[(attention, positions, reference)],
                test="setting",
                group=f"{attention}/{positions}",
                a=setting_label(setting),
                b=setting_label(reference),
            )
    return entries


def context_table(rows):
    """Mean and sd over seeds of every test metric per (attention, routing, positions, training length, scaling)."""
    table = []
    for (label, positions, setting), group_rows in context_groups(rows).items():
        entry = {
            **split_variant(label),
            "positions": positions,
            "train_len": setting[0],
            "scaling": setting[1],
            "seeds": len(group_rows),
        }
        for length in LENGTHS:
            for name in METRIC_NAMES:
                values = [float(row[f"test_{length}_{name}"]) for row in group_rows]
                entry[f"{length}_{name}_mean"], entry[f"{length}_{name}_sd"] = mean_sd(values)
        table.append(entry)
    return table


def context_markdown(rows, stats):
    """The summary's section on the context-extension axes: accuracy and loss per setting, and the tests."""
    columns = [(length, name) for name in ("accuracy", "mlm_loss") for length in LENGTHS]
    lines = [
        "",
        "## Context extension: training length and RoPE scaling at evaluation",
        "",
        "L<n> = trained at n tokens (1x = n, 4x = 4n); the scaling (none, linear, ntk, yarn) is applied to the "
        "trained model at evaluation only, at both lengths. Mean ± sd over seeds.",
        "",
    ]
    lines += markdown_lines(
        ["attention", "routing", "positions", "train length", "scaling", "seeds", *column_labels(columns)],
        [
            [
                entry["attention"],
                entry["routing"],
                entry["positions"],
                entry["train_len"],
                entry["scaling"],
                entry["seeds"],
                *mean_sd_cells(entry, columns),
            ]
            for entry in context_table(rows)
        ],
    )
    lines += [
        "",
        "Welch's t-tests on accuracy (two-sided, over seeds): mean(a) - mean(b), p-value and mark; every metric is "
        "in mlm_context_stats.csv.",
        "",
    ]
    by_pair = {}
    for entry in stats:
        if entry["metric"] == "accuracy":
            by_pair.setdefault((entry["test"], entry["group"], entry["a"], entry["b"]), {})[entry["length"]] = entry
    lines += markdown_lines(
        ["test", "within", "a", "b", *column_labels([(length, "accuracy") for length in LENGTHS])],
        [
            [test, group, a, b, *(welch_cell(by_length[length]) for length in LENGTHS)]
            for (test, group, a, b), by_length in by_pair.items()
        ],
    )
    return "\n".join(lines) + "\n"
