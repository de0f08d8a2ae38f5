"""The fine-tuning sweep's statistics and Markdown summary from the rows of ``finetune_runs.csv``: each model's score
per task over seeds, the GLUE average, Welch's tests against the baselines and every validation metric."""

import json
import math

from ...results.stats import mean_sd, mean_sd_cell, welch_entry
from ...results.tables import markdown_lines
from ...training.finetune.tasks import get_task

GLUE_AVERAGE = "GLUE average"


def in_order(values):
    return list(dict.fromkeys(values))


def scores_by(rows) -> dict:
    """{(model, task): {seed: score}}, with (model, GLUE_AVERAGE) for the seeds that have every GLUE task run."""
    scores = {}
    for row in rows:
        scores.setdefault((row["model"], row["task"]), {})[int(row["seed"])] = float(row["score"])
    glue = [task for task in in_order(row["task"] for row in rows) if in_glue_average(task)]
    if glue:
        for model in in_order(row["model"] for row in rows):
            per_task = [scores.get((model, task), {}) for task in glue]
            seeds = sorted(set.intersection(*(set(seed_scores) for seed_scores in per_task)))
            if seeds:
                scores[(model, GLUE_AVERAGE)] = {seed: sum(s[seed] for s in per_task) / len(glue) for seed in seeds}
    return scores


def columns_of(rows, scores, model_order=(), task_order=()):
    """Models and tasks in the given order (the command line's), then any others in the CSV's order."""
    models = in_order([*(m for m in model_order if any(r["model"] == m for r in rows)), *(r["model"] for r in rows)])
    tasks = in_order([*(t for t in task_order if any(r["task"] == t for r in rows)), *(r["task"] for r in rows)])
    if any(task == GLUE_AVERAGE for _, task in scores):
        tasks.append(GLUE_AVERAGE)
    return models, tasks


def comparisons(scores, models, tasks, baselines) -> list[dict]:
    """Welch's t-test of every model against each baseline on every task's score (each pair once)."""
    entries, seen = [], set()
    for baseline in baselines:
        for model in models:
            if model == baseline or frozenset((model, baseline)) in seen:
                continue
            seen.add(frozenset((model, baseline)))
            for task in tasks:
                a, b = scores.get((model, task)), scores.get((baseline, task))
                if a and b:
                    entries.append(
                        welch_entry(
                            list(a.values()),
                            list(b.values()),
                            task=task,
                            model=model,
                            baseline=baseline,
                            n_model=len(a),
                            n_baseline=len(b),
                        )
                    )
    return entries


def metric_table(rows, scores, models, tasks) -> list[dict]:
    """Mean, sd and n over seeds per model, task and metric (the score and every validation metric)."""
    table = []
    for task in tasks:
        for model in models:
            if (model, task) not in scores:
                continue
            values = {"score": list(scores[(model, task)].values())}
            for row in rows:
                if (row["model"], row["task"]) == (model, task):
                    for key, value in json.loads(row["metrics"]).items():
                        if isinstance(value, (int, float)):
                            values.setdefault(key, []).append(float(value))
            for metric, metric_values in values.items():
                mean, sd = mean_sd(metric_values)
                table.append(
                    {"model": model, "task": task, "metric": metric, "n": len(metric_values), "mean": mean, "sd": sd}
                )
    return table


def in_glue_average(task) -> bool:
    return get_task(task).group == "glue" and task != "wnli"


def summary_markdown(rows, scores, models, tasks, stats, baselines) -> str:
    seeds = sorted({int(row["seed"]) for row in rows})
    glue = [task for task in tasks if task != GLUE_AVERAGE and in_glue_average(task)]
    lines = [
        f"# Fine-tuning: {len(models)} models x {len(tasks) - (GLUE_AVERAGE in tasks)} tasks x seeds {seeds}",
        "",
        "Score, mean ± sd over seeds (n): GLUE tasks 100 x the leaderboard metric, other tasks their main "
        "metric." + (f" The GLUE average is over {', '.join(glue)} (WNLI excluded), per seed." if glue else ""),
        "",
    ]
    body = []
    for model in models:
        cells = [model]
        for task in tasks:
            values = list(scores.get((model, task), {}).values())
            cells.append(f"{mean_sd_cell(values, 2)} ({len(values)})" if values else "")
        body.append(cells)
    lines += markdown_lines(["model", *tasks], body)
    if stats:
        lines += [
            "",
            f"Welch's two-sided t-test of each model against {', '.join(baselines)} on the score "
            "(* p<0.05, ** p<0.01, *** p<0.001, n.s. otherwise; n/a: a model with one seed, or no variance in "
            "either):",
            "",
        ]
        lines += markdown_lines(
            ["task", "model", "baseline", "model mean", "baseline mean", "difference", "p", ""],
            [
                [
                    e["task"],
                    e["model"],
                    e["baseline"],
                    f"{e['mean_a']:.2f}",
                    f"{e['mean_b']:.2f}",
                    f"{e['difference']:+.2f}",
                    "n/a" if math.isnan(e["p_value"]) else f"{e['p_value']:.3g}",
                    e["mark"],
                ]
                for e in stats
            ],
        )
    lines += ["", "Every validation metric (mean ± sd over seeds):"]
    for task in (task for task in tasks if task != GLUE_AVERAGE):
        metrics = in_order(key for row in rows if row["task"] == task for key in json.loads(row["metrics"]))
        body = []
        for model in models:
            per_metric = {}
            for row in rows:
                if (row["model"], row["task"]) == (model, task):
                    for key, value in json.loads(row["metrics"]).items():
                        per_metric.setdefault(key, []).append(float(value))
            if per_metric:
                body.append(
                    [model, *(mean_sd_cell(per_metric[key], 4) if key in per_metric else "" for key in metrics)]
                )
        lines += ["", f"**{task}**", "", *markdown_lines(["model", *metrics], body)]
    return "\n".join(lines) + "\n"
