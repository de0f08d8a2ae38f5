"""The MLM comparisons of the DTA paper (experiments 2a/2b on text, 3 on proteins): attention type x position arm x
seed, and the context-extension axes (training length x RoPE scaling at evaluation).

Every arm is the same base run config (`encoderlab.training.pretrain`: same corpus, architecture and token
budget) with four fields set: ``model.config.attention_type``, ``model.config.position_embedding_type``,
``train.drope_fraction`` and ``train.seed``. The position arms are

- ``rope``: RoPE throughout;
- ``none``: no position encoding;
- ``rope-off``: RoPE for the first 70% of the budget, then switched off for good (DroPE).

Head sizes follow the paper: a dual triangle head is twice as wide as a bidirectional or causal one (each of its
two triangle halves has the base head size), so at equal hidden size it has half as many heads. The base head
size is ``--head-size``, or else the head width of the base config (half of it when that config is dual
triangle, whose heads hold two halves).

``--domain`` picks the CPU-sized base config: ``text`` (``mlm_comparison``, the embedded English reference text,
byte-level BPE) or ``protein`` (``mlm_protein``: the same model on UniProt sequences from a FASTA file, ESM-2
tokenizer; ``--data PATH`` points it at another file). The paper's setups are ``--config dta_nl`` and
``--config dta_protein`` (OMG-Prot50), on GPUs.

Context-extension axes (the paper trains at one length and evaluates at 1x and 4x):

- ``--seq-lens 64 128``: training lengths; each run is evaluated at 1x and 4x its own length, on held-out
  documents of at least 4x it. Runs at a length other than the base config's go to ``...-L<length>`` folders.
- ``--eval-scaling none linear ntk yarn``: RoPE scaling (factor ``--scaling-factor``, by default
  ``data.long_factor``) applied to each finished ``rope`` run when it is evaluated, at both lengths: the saved
  model is reloaded with the scaling in its config, so training never sees it and no run is retrained. Each
  scaling is one more row (``scaling`` column) of the same run.

- ``--routing channel_halves head_groups``: the dual triangle head routing (``dual_triangle_routing``: the paper's
  equation 3, or the reference code's whole-head groups); it changes the model, so each routing is its own training
  run (``...-head_groups`` folders). Bidirectional and causal arms have no routing and are trained once. In tables
  and figures a head_groups run is the attention type ``dual_triangle:head_groups`` (plain ``dual_triangle`` is
  channel_halves), so it is compared with the other attention types like one of them.

A later axis that changes the model is one more `Arm` field.

Each run trains through `pretrain` into ``OUT/runs/<attention>-<positions>-s<seed>``; when it finishes, one row
with its test metrics at 1x and 4x the training length (masked-token loss, accuracy, micro-F1, MCC) goes to
``OUT/mlm_runs.csv`` and its evaluation curve to ``OUT/mlm_curves.csv``. Rerunning skips finished runs and
resumes an interrupted one from its last checkpoint. The summary compares attention types within each position
arm, and rope with rope-off within each attention type, with two-sided Welch's t-tests over seeds:

- ``mlm_summary.md`` / ``mlm_table.csv`` / ``mlm_stats.csv``: mean +- sd and the tests (* p<0.05, ** p<0.01,
  *** p<0.001, n.s. otherwise);
- ``mlm_bars.png`` (Figures 3c-d/4c-d), ``mlm_curves.png`` (Figures 3a-b), ``mlm_drope.png`` (Figure 5).

These use the reference setting (the shortest training length, no scaling). With more than one setting, the
summary gains a context-extension section, with ``mlm_context_table.csv``, ``mlm_context_stats.csv`` (attention
types compared within each setting; each setting against the reference within each attention type) and
``mlm_context.png``.

Usage (the default config is the CPU-sized ``mlm_comparison``; see the README)::

    encoderlab experiment mlm --attention bidirectional dual_triangle --positions rope none rope-off \\
        --seeds 0 1 2 --out-dir runs/mlm_comparison --workers 2
    encoderlab experiment mlm --domain protein --seq-lens 64 128 --out-dir runs/mlm_protein --workers 2
    encoderlab experiment mlm --config dta_nl --set train.token_budget=1e8 ...   # the paper's setup, on GPUs
    encoderlab experiment mlm --plots-only --out-dir runs/mlm_comparison        # redraw from the CSVs

or ``python -m encoderlab.experiments.mlm_comparison``.
"""

import csv
import dataclasses
import hashlib
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import torch

from ..configuration.dta import ATTENTION_TYPES, DUAL_TRIANGLE_ROUTINGS, DTABertConfig
from ..results.plots import pyplot
from ..results.rows import append_rows, read_results, write_rows
from ..results.stats import mean_sd, welch_entry
from ..training.metrics import METRIC_NAMES
from ..training.pretrain import RunConfig, load_run_config, pretrain
from ..training.run_folder import METRICS_FILE, RESULTS_FILE, RunFinished
from .argmax import heads_for
from .mlm_comparison_cli import DEFAULT_ROUTING, DOMAINS, POSITION_ARMS, SCALINGS, add_arguments  # noqa: F401
from .sweeps import run_jobs

logger = logging.getLogger(__name__)

LENGTHS = {"short": "1x", "long": "4x"}
METRIC_LABELS = {"mlm_loss": "loss", "accuracy": "accuracy", "micro_f1": "micro-F1", "mcc": "MCC"}
DEFAULT_CONFIG = DOMAINS["text"]
RUNS_CSV, CURVES_CSV = "mlm_runs.csv", "mlm_curves.csv"
ARM_FIELDS = ("attention", "positions", "seed", "train_len", "scaling", "routing")
"""The columns that identify a row of ``mlm_runs.csv``."""
VARIANTS = (*ATTENTION_TYPES, *(f"dual_triangle:{routing}" for routing in DUAL_TRIANGLE_ROUTINGS[1:]))
"""The attention axis of tables, tests and figures: the attention types, and dual triangle under each routing
other than the default (plain ``dual_triangle`` is the default routing)."""


def variant(attention, routing):
    """The `VARIANTS` entry of a run."""
    return f"{attention}:{routing}" if attention == "dual_triangle" and routing not in ("", DEFAULT_ROUTING) \
        else attention


def variant_of(row):
    """The `VARIANTS` entry of a CSV row (rows of sweeps from before the routing axis have no routing)."""
    return variant(row["attention"], row.get("routing") or DEFAULT_ROUTING)


def split_variant(label):
    """{"attention", "routing"} of a `VARIANTS` entry; routing "-" where the attention type has none."""
    attention, _, routing = label.partition(":")
    return {"attention": attention, "routing": routing or (DEFAULT_ROUTING if attention == "dual_triangle" else "-")}


# ----------------------------------------------------------------------------------------------------------- arms

@dataclass(frozen=True)
class Arm:
    """One row of the results: a trained model (attention, positions, seed, training length, dual triangle head
    routing) evaluated with one RoPE scaling. ``seq_len`` None means the base config's training length. Arms that
    differ only in ``scaling`` share one training run. An axis that changes the model is one more field here, set
    in `arm_config` and named in `name`."""

    attention: str
    positions: str
    seed: int
    seq_len: int | None = None
    scaling: str = "none"
    routing: str = DEFAULT_ROUTING

    @property
    def name(self):
        """The run folder's name (of the training run, so without the evaluation-time scaling); the default
        routing adds nothing, so the runs of sweeps from before the routing axis keep their folders."""
        length = "" if self.seq_len is None else f"-L{self.seq_len}"
        routing = "" if self.routing == DEFAULT_ROUTING else f"-{self.routing}"
        return f"{self.attention}-{self.positions}-s{self.seed}{length}{routing}"

    @property
    def trained(self):
        """The arm of the training run behind this one (no scaling)."""
        return dataclasses.replace(self, scaling="none")

    def key(self, base_seq_len):
        return (self.attention, self.positions, str(self.seed), str(self.seq_len or base_seq_len), self.scaling,
                self.routing)


def grid(attentions, positions, seeds, seq_lens=(None,), scalings=("none",), routings=(DEFAULT_ROUTING,)):
    """Every combination; scalings other than ``none`` only for ``rope`` arms, the only ones that end training
    with RoPE (``none`` has no RoPE to scale, ``rope-off`` has switched it off). ``none`` is always in: it is the
    trained run itself. The routings apply to dual triangle arms; the other attention types have none and are
    trained once, with the default routing's value (which they never read)."""
    for scaling in scalings:
        if scaling not in SCALINGS:
            raise ValueError(f"scaling={scaling!r} is not an evaluation-time RoPE scaling; allowed: {SCALINGS}")
    for routing in routings:
        if routing not in DUAL_TRIANGLE_ROUTINGS:
            raise ValueError(f"routing={routing!r} is not a dual triangle head routing; allowed: "
                             f"{DUAL_TRIANGLE_ROUTINGS}")
    scalings = list(dict.fromkeys(["none", *scalings]))
    routings = list(dict.fromkeys(routings))
    return [Arm(a, p, s, n, k, r) for a in attentions for r in (routings if a == "dual_triangle" else
                                                                  [DEFAULT_ROUTING])
            for p in positions for n in seq_lens for s in seeds for k in scalings if k == "none" or p == "rope"]


def base_head_size(base: RunConfig, head_size=None):
    """`head_size`, or the head width of the base config (per triangle half when the config is dual triangle)."""
    if head_size is not None:
        return head_size
    config = DTABertConfig(**base.model.config)
    return config.head_dim // 2 if config.attention_type == "dual_triangle" else config.head_dim


def arm_config(base: RunConfig, arm: Arm, head_size: int, out_dir: Path) -> RunConfig:
    """The training run of `arm`: the base config with the arm's attention, head routing, positions, DroPE
    fraction, seed, training length, heads and run folder. The arm's RoPE scaling is not in it: it is applied at
    evaluation only (`evaluate_scaled`), and the base config must not set one."""
    if base.model.config.get("rope_scaling_type") is not None:
        raise ValueError(f"model.config.rope_scaling_type={base.model.config['rope_scaling_type']!r}: the MLM "
                         "comparison trains without RoPE scaling and applies it at evaluation (--eval-scaling)")
    if base.model.family != "dta_bert":
        raise ValueError(f"model.family={base.model.family!r}: the MLM comparison varies DTA-BERT's attention_type")
    position_type, drope_fraction = POSITION_ARMS[arm.positions]
    hidden_size = base.model.config.get("hidden_size", DTABertConfig().hidden_size)
    model_config = {
        **base.model.config,
        "attention_type": arm.attention,
        "dual_triangle_routing": arm.routing,
        "position_embedding_type": position_type,
        "num_attention_heads": heads_for(arm.attention, hidden_size, head_size),
    }
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, config=model_config),
        train=dataclasses.replace(base.train, drope_fraction=drope_fraction, seed=arm.seed,
                                  seq_len=arm.seq_len or base.train.seq_len),
        output_dir=str(out_dir / "runs" / arm.name),
    )


def config_hash(base: RunConfig, head_size: int):
    """Identifies the shared setup of a sweep (the base config with the per-arm fields fixed, and the head size);
    rows of another setup must not be mixed into its CSV."""
    reference = arm_config(base, Arm(ATTENTION_TYPES[0], "none", 0), head_size, Path())
    setup = {**reference.to_dict(), "output_dir": None, "head_size": head_size}
    # An arm field, like attention_type; left out so that sweeps from before the routing axis keep their setup.
    del setup["model"]["config"]["dual_triangle_routing"]
    return hashlib.sha1(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------------- training

def train_arm(arm: Arm | None, run: RunConfig, setup: str, scalings=(), factor=None, trained=None):
    """Train one arm (resuming its last checkpoint if it has one), or take `trained`, the row of its finished run
    (arm None); then evaluate that run with each RoPE scaling of `scalings`. Returns the new CSV rows and the
    training curve points."""
    rows, curve = [], []
    if arm is not None:
        trained, curve = trained_row(arm, run, setup)
        rows.append(trained)
    if scalings:
        test_sets = test_sets_of(run)
        for scaling in scalings:
            start = time.perf_counter()
            metrics = evaluate_scaled(run, scaling, factor, test_sets)
            rows.append({
                **trained, "scaling": scaling,
                **{f"test_{length}_{name}": metrics[length][name] for length in LENGTHS for name in METRIC_NAMES},
                "wall_seconds": round(time.perf_counter() - start, 1),  # of the evaluation
            })
    return rows, curve


def trained_row(arm: Arm, run: RunConfig, setup: str):
    run_dir = Path(run.output_dir)
    start = time.perf_counter()
    try:  # an interrupted run resumes from its last checkpoint (or restarts if it stopped before the first one)
        result = pretrain(run, resume=run_dir.is_dir() and any(run_dir.iterdir()))
        results, model, log_history = result.results, result.trainer.model, result.trainer.state.log_history
    except RunFinished:  # the run finished, but the sweep stopped before its row reached the CSV
        results, model, log_history = finished_run(run_dir)
    row = {
        "attention": arm.attention, "positions": arm.positions, "seed": arm.seed, "train_len": run.train.seq_len,
        "scaling": arm.scaling, "routing": arm.routing,
        "setup": setup,
        "heads": run.model.config["num_attention_heads"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": results["steps"],
        "tokens_seen": results["tokens_seen"],
        "drope_step": results["drope_step"] or "",
        **{f"test_{length}_{name}": results["test"][length][name] for length in LENGTHS for name in METRIC_NAMES},
        **{f"unigram_{length}": results["unigram_baseline"][length] for length in LENGTHS},
        "wall_seconds": round(time.perf_counter() - start, 1),  # of this (possibly resumed) session only
        "run_dir": str(run_dir),
    }
    return row, curve_points(log_history, row)


def finished_run(run_dir: Path):
    """Results, model and training log of a finished run, read back from its folder."""
    from transformers import AutoModelForMaskedLM

    results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    log_history = []
    if (run_dir / METRICS_FILE).is_file():
        with (run_dir / METRICS_FILE).open(newline="", encoding="utf-8") as handle:
            log_history = [
                {key: float(value) for key, value in entry.items() if value != ""} for entry in csv.DictReader(handle)
            ]
        for entry in log_history:
            entry["step"] = int(entry["step"])
    return results, model, log_history


def test_sets_of(run: RunConfig):
    """The run's test windows at 1x and 4x, rebuilt exactly as `pretrain` built them (same documents, split seed
    and tokenizer, which is loaded from the run folder)."""
    from transformers import AutoTokenizer

    from ..training.data import load_documents, split_documents
    from ..training.pretrain import evaluation_sets

    tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
    documents = list(load_documents(run.data.source, text_field=run.data.text_field, split=run.data.split,
                                    streaming=run.data.streaming, limit=run.data.limit))
    splits = split_documents(documents, validation_size=run.data.validation_size, test_size=run.data.test_size,
                             seed=run.train.seed)
    return evaluation_sets(splits["test"], tokenizer, run, "test")


def scaling_fields(scaling: str, factor: float, train_len: int):
    """Config fields of an evaluation-time RoPE scaling; YaRN measures wavelengths against the training length
    (not ``max_position_embeddings``, which the pipeline sets to the long evaluation length)."""
    if scaling == "none":
        return {"rope_scaling_type": None, "rope_scaling_factor": 1.0}
    return {"rope_scaling_type": scaling, "rope_scaling_factor": float(factor),
            "rope_original_max_position_embeddings": train_len}


def load_scaled_model(run_dir, scaling: str, factor: float, train_len: int):
    """The trained model of `run_dir` with RoPE scaling `scaling` (factor `factor`); the weights are the saved
    ones, the saved config is not changed. The config is rebuilt so that its own checks run on the new fields."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    import encoderlab  # noqa: F401  (registers the families with the Auto classes)

    saved = AutoConfig.from_pretrained(run_dir)
    if saved.position_embedding_type != "rope" and scaling != "none":
        raise ValueError(f"scaling={scaling!r} needs a RoPE model; {run_dir} has position_embedding_type="
                         f"{saved.position_embedding_type!r}")
    config = type(saved).from_dict({**saved.to_dict(), **scaling_fields(scaling, factor, train_len)})
    return AutoModelForMaskedLM.from_pretrained(run_dir, config=config)


def evaluate_scaled(run: RunConfig, scaling: str, factor: float, test_sets=None):
    """Test metrics at 1x and 4x of the finished run in `run.output_dir` evaluated with RoPE scaling `scaling`:
    {"short": {metric: value}, "long": {...}}. The masks are the ones `pretrain` scored (same collator seed), so
    ``scaling="none"`` reproduces the run's own test metrics."""
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    from ..training.collator import MLMCollator
    from ..training.metrics import compute_metrics, preprocess_logits_for_metrics
    from ..training.trainer import cpu_only, use_bf16

    model = load_scaled_model(run.output_dir, scaling, factor, run.train.seq_len)
    test_sets = test_sets_of(run) if test_sets is None else test_sets
    tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
    collator = MLMCollator(tokenizer, seed=run.train.seed, mlm_probability=run.mlm.probability,
                           mask_replace_prob=run.mlm.mask_replace_prob, random_replace_prob=run.mlm.random_replace_prob)
    args = TrainingArguments(output_dir=run.output_dir, per_device_eval_batch_size=run.train.eval_batch_size
                             or run.train.batch_size, bf16=use_bf16(run.train.precision), use_cpu=cpu_only(),
                             report_to="none")  # evaluated as `pretrain` evaluates
    trainer = Trainer(model=model, args=args, data_collator=collator, compute_metrics=compute_metrics,
                      preprocess_logits_for_metrics=preprocess_logits_for_metrics)
    metrics = trainer.evaluate(eval_dataset=test_sets, metric_key_prefix="test")
    return {length: {name: metrics[f"test_{length}_{name}"] for name in METRIC_NAMES} for length in LENGTHS}


def curve_points(log_history, row):
    """One point per evaluation during training and length. `pretrain` evaluates the final model once more at
    the last step; that repeat is dropped."""
    points, tokens = {}, 0
    arm = {name: row[name] for name in ("attention", "positions", "seed", "train_len", "routing")}
    for entry in log_history:
        tokens = entry.get("num_input_tokens_seen", tokens)
        for length in LENGTHS:
            if f"eval_{length}_accuracy" in entry:
                points.setdefault((entry["step"], length), {
                    **arm, "step": entry["step"], "tokens": tokens, "length": length,
                    **{name: entry[f"eval_{length}_{name}"] for name in METRIC_NAMES},
                })
    return list(points.values())


def check_setup(rows, setup: str, csv_path: Path):
    other = {row["setup"] for row in rows} - {setup}
    if other:
        raise ValueError(f"{csv_path} holds runs of another config (setup {sorted(other)}, this one {setup}); "
                         "choose another --out-dir, or delete it to start over")


def migrate_csv(path: Path, columns, train_len):
    """Adds the `columns` (of ``train_len``, ``scaling``, ``routing``) that the CSV of a sweep from before the
    context-extension axes lacks, so that new rows can be appended to it: its runs were trained at the base length,
    without scaling, with the default routing."""
    rows = read_results(path)
    if rows and any(name not in rows[0] for name in columns):
        defaults = {"train_len": train_len, "scaling": "none", "routing": DEFAULT_ROUTING}
        write_rows(path, [{**{name: defaults[name] for name in columns}, **row} for row in rows])


def jobs_for(arms, base: RunConfig, head_size: int, out_dir: Path, rows: list, setup: str, factor):
    """`train_arm` arguments, one job per training run with anything to do: train it unless `rows` hold its row,
    then evaluate it with the scalings of its arms that have no row yet."""
    done = {tuple(row[name] for name in ARM_FIELDS): row for row in rows}
    by_run = {}
    for arm in arms:
        if arm.key(base.train.seq_len) not in done:
            by_run.setdefault(arm.trained, []).append(arm.scaling)
    jobs = []
    for trained, scalings in by_run.items():
        trained_row = done.get(trained.key(base.train.seq_len))
        run = arm_config(base, trained, head_size, out_dir)
        jobs.append((None if trained_row else trained, run, setup, [k for k in scalings if k != "none"], factor,
                     trained_row))
    return jobs


def sweep(arms, base: RunConfig, head_size: int, out_dir: Path, workers=1, factor=None):
    """Train every arm without a row in ``mlm_runs.csv`` and evaluate the trained runs with the RoPE scalings
    (factor `factor`, by default ``data.long_factor``) of the arms that have none; rows (and curves) are appended
    as runs finish, so a crash loses only the runs in flight. Returns the number of rows added."""
    runs_csv = out_dir / RUNS_CSV
    setup = config_hash(base, head_size)
    migrate_csv(runs_csv, ("train_len", "scaling", "routing"), base.train.seq_len)
    migrate_csv(out_dir / CURVES_CSV, ("train_len", "routing"), base.train.seq_len)
    rows = read_results(runs_csv)
    check_setup(rows, setup, runs_csv)
    jobs = jobs_for(arms, base, head_size, out_dir, rows, setup, factor or base.data.long_factor)
    todo = sum((arm is not None) + len(scalings) for arm, _, _, scalings, *_ in jobs)
    logger.info("%d of %d rows already in %s; %d training runs and %d rows to go", len(arms) - todo, len(arms),
                runs_csv, sum(arm is not None for arm, *_ in jobs), todo)
    for new_rows, curve in run_jobs(train_arm, jobs, workers, worker_setup=_init_worker):
        append_rows(out_dir / CURVES_CSV, curve)
        append_rows(runs_csv, new_rows)
        for row in new_rows:
            logger.info("%s: test accuracy %.3f (1x) %.3f (4x)", row_label(row), float(row["test_short_accuracy"]),
                        float(row["test_long_accuracy"]))
    return todo


def _init_worker(threads):
    import transformers

    torch.set_num_threads(threads)
    # Quiet workers: interleaved progress bars of parallel runs are unreadable (this also turns the Trainer's off).
    transformers.logging.set_verbosity_error()


# ----------------------------------------------------------------------------------------------------- statistics

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
                results.append(welch_entry(grouped[a][f"{length}_{name}"], grouped[b][f"{length}_{name}"],
                                           a="/".join(a), b="/".join(b), length=length, metric=name))
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


def summary_markdown(rows, stats):
    metric_columns = [(length, name) for length in LENGTHS for name in METRIC_NAMES]
    header = " | ".join(f"{METRIC_LABELS[name]} {LENGTHS[length]}" for length, name in metric_columns)
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
        f"| attention | routing | positions | seeds | {header} |",
        "|---|---|---|---|" + "---|" * len(metric_columns),
    ]
    for entry in table_rows(rows):
        cells = mean_sd_cells(entry, metric_columns)
        lines.append(f"| {entry['attention']} | {entry['routing']} | {entry['positions']} | {entry['seeds']} | "
                     f"{' | '.join(cells)} |")
    unigram = {length: statistics.mean(float(row[f"unigram_{length}"]) for row in rows) for length in LENGTHS}
    lines += [
        "",
        f"Unigram baseline (always the most frequent training token), test accuracy: {unigram['short']:.3f} (1x), "
        f"{unigram['long']:.3f} (4x).",
        "",
        "## Welch's t-tests (two-sided, over seeds)",
        "",
        "Each cell: mean(a) - mean(b), p-value and mark (* p<0.05, ** p<0.01, *** p<0.001, n.s. p>=0.05).",
        "",
        "| a | b | length | " + " | ".join(METRIC_LABELS[name] for name in METRIC_NAMES) + " |",
        "|---|---|---|" + "---|" * len(METRIC_NAMES),
    ]
    by_pair = {}
    for entry in stats:
        by_pair.setdefault((entry["a"], entry["b"], entry["length"]), {})[entry["metric"]] = entry
    for (a, b, length), metrics in by_pair.items():
        cells = [f"{m['difference']:+.3f} (p={m['p_value']:.2g} {m['mark']})".replace(" )", ")")
                 for m in (metrics[name] for name in METRIC_NAMES)]
        lines.append(f"| {a} | {b} | {LENGTHS[length]} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- context extension axes

def row_label(row):
    return f"{variant_of(row)}-{row['positions']}-s{row['seed']} (L{row['train_len']}, {row['scaling']})"


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
    return dict(sorted(grouped.items(), key=lambda item: (list(POSITION_ARMS).index(item[0][1]),
                                                          order.index(item[0][2]), VARIANTS.index(item[0][0]))))


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
                entries += welch_entries(grouped[(a, positions, setting)], grouped[(b, positions, setting)],
                                         test="attention", group=f"{positions}, {setting_label(setting)}", a=a, b=b)
    for (attention, positions, setting), group_rows in grouped.items():
        if setting != reference and (attention, positions, reference) in grouped:
            entries += welch_entries(group_rows, grouped[(attention, positions, reference)], test="setting",
                                     group=f"{attention}/{positions}", a=setting_label(setting),
                                     b=setting_label(reference))
    return entries


def context_table(rows):
    """Mean and sd over seeds of every test metric per (attention, routing, positions, training length, scaling)."""
    table = []
    for (label, positions, setting), group_rows in context_groups(rows).items():
        entry = {**split_variant(label), "positions": positions, "train_len": setting[0], "scaling": setting[1],
                 "seeds": len(group_rows)}
        for length in LENGTHS:
            for name in METRIC_NAMES:
                values = [float(row[f"test_{length}_{name}"]) for row in group_rows]
                entry[f"{length}_{name}_mean"], entry[f"{length}_{name}_sd"] = mean_sd(values)
        table.append(entry)
    return table


def context_markdown(rows, stats):
    """The summary's section on the context-extension axes: accuracy and loss per setting, and the tests."""
    columns = [(length, name) for name in ("accuracy", "mlm_loss") for length in LENGTHS]
    header = " | ".join(f"{METRIC_LABELS[name]} {LENGTHS[length]}" for length, name in columns)
    lines = [
        "",
        "## Context extension: training length and RoPE scaling at evaluation",
        "",
        "L<n> = trained at n tokens (1x = n, 4x = 4n); the scaling (none, linear, ntk, yarn) is applied to the "
        "trained model at evaluation only, at both lengths. Mean ± sd over seeds.",
        "",
        f"| attention | routing | positions | train length | scaling | seeds | {header} |",
        "|---|---|---|---|---|---|" + "---|" * len(columns),
    ]
    for entry in context_table(rows):
        cells = mean_sd_cells(entry, columns)
        lines.append(f"| {entry['attention']} | {entry['routing']} | {entry['positions']} | {entry['train_len']} | "
                     f"{entry['scaling']} | {entry['seeds']} | {' | '.join(cells)} |")
    lines += [
        "",
        "Welch's t-tests on accuracy (two-sided, over seeds): mean(a) - mean(b), p-value and mark; every metric is "
        "in mlm_context_stats.csv.",
        "",
        "| test | within | a | b | accuracy 1x | accuracy 4x |",
        "|---|---|---|---|---|---|",
    ]
    by_pair = {}
    for entry in stats:
        if entry["metric"] == "accuracy":
            by_pair.setdefault((entry["test"], entry["group"], entry["a"], entry["b"]), {})[entry["length"]] = entry
    for (test, group, a, b), by_length in by_pair.items():
        cells = [f"{m['difference']:+.3f} (p={m['p_value']:.2g} {m['mark']})".replace(" )", ")")
                 for m in (by_length[length] for length in LENGTHS)]
        lines.append(f"| {test} | {group} | {a} | {b} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def write_csv(path, rows):
    write_rows(path, rows)


# ---------------------------------------------------------------------------------------------------------- plots

COLORS = {"bidirectional": "tab:blue", "causal": "tab:green", "dual_triangle": "tab:red",  # attention variants
          "dual_triangle:head_groups": "tab:brown",
          "rope": "tab:purple", "none": "tab:gray", "rope-off": "tab:orange"}  # position arms (Figure 5 bars)
ARM_STYLES = {"rope": "-", "none": ":", "rope-off": "--"}


def draw_bracket(axis, x1, x2, y, leg, text):
    axis.plot([x1, x1, x2, x2], [y - leg, y, y, y - leg], color="black", linewidth=0.8)
    axis.text((x1 + x2) / 2, y, text, ha="center", va="bottom", fontsize=7)


def legend_label(name, series):
    """`name`, naming the default routing of plain dual triangle when another routing is drawn beside it."""
    if name == "dual_triangle" and any(other.startswith("dual_triangle:") for other in series):
        return f"dual_triangle:{DEFAULT_ROUTING}"
    return name


def bar_panel(axis, grouped, stats, categories, series, key_of, column):
    """Bars of mean +- sd: one cluster per category, one bar per series; brackets for the tested pairs."""
    width = 0.8 / len(series)
    bar_x, tops = {}, {}  # group key -> bar centre, top of its error bar
    for index, name in enumerate(series):
        bars = [(c, key_of(category, name)) for c, category in enumerate(categories)]
        bars = [(c - 0.4 + width * (index + 0.5), key, *mean_sd(grouped[key][column])) for c, key in bars
                if key in grouped]
        axis.bar([x for x, *_ in bars], [m for _, _, m, _ in bars], width, yerr=[s for *_, s in bars], capsize=2,
                 label=legend_label(name, series), color=COLORS[name], edgecolor="black", linewidth=0.4)
        for x, key, mean, sd in bars:
            bar_x[key], tops[key] = x, mean + sd
    span = max(tops.values(), default=1.0) or 1.0
    levels = {}  # cluster -> brackets already drawn over it, so the next one goes higher
    length, metric = column.split("_", 1)
    for entry in stats:
        a, b = tuple(entry["a"].split("/")), tuple(entry["b"].split("/"))
        if (entry["length"], entry["metric"]) == (length, metric) and entry["mark"] and a in bar_x and b in bar_x:
            cluster = round(min(bar_x[a], bar_x[b]))
            level = levels[cluster] = levels.get(cluster, -1) + 1
            y = max(tops[a], tops[b]) + span * (0.04 + 0.09 * level)
            draw_bracket(axis, bar_x[a], bar_x[b], y, span * 0.02, entry["mark"])
    axis.set_xticks(range(len(categories)), categories)
    axis.set_ylim(top=span * (1.12 + 0.09 * (max(levels.values(), default=-1) + 1)))
    axis.grid(axis="y", alpha=0.3)


def plot_bars(rows, stats, path):
    """Figures 3c-d: test metrics at 1x (top) and 4x (bottom); clusters = position arms, bars = attention types."""
    plt = pyplot()
    grouped = groups(rows)
    attentions = [a for a in VARIANTS if any(key[0] == a for key in grouped)]
    arms = [p for p in POSITION_ARMS if any(key[1] == p for key in grouped)]
    attention_stats = [entry for entry in stats if entry["a"].split("/")[1] == entry["b"].split("/")[1]]
    figure, axes = plt.subplots(len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4),
                                squeeze=False, layout="constrained")
    for row_index, (length, label) in enumerate(LENGTHS.items()):
        for col_index, name in enumerate(METRIC_NAMES):
            axis = axes[row_index][col_index]
            bar_panel(axis, grouped, attention_stats, arms, attentions, lambda arm, att: (att, arm),
                      f"{length}_{name}")
            axis.set_title(f"test {METRIC_LABELS[name]}, {label} length", fontsize=9)
    axes[0][0].legend(fontsize=7)
    figure.suptitle("MLM: attention type x position arm (mean ± sd over seeds; Welch's t-test)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def curve_groups(curves, arms=None):
    """{(attention, positions, length): [(mean tokens, {metric: (mean, sd)}) per evaluation]}. Seeds differ a
    little in steps (the document split follows the seed), so evaluations are aligned by their index."""
    per_seed = {}
    for point in curves:
        if arms is None or point["positions"] in arms:
            key = (variant_of(point), point["positions"], point["length"])
            per_seed.setdefault(key, {}).setdefault(point["seed"], []).append(point)
    result = {}
    for key, seeds in per_seed.items():
        series = [sorted(points, key=lambda p: int(p["step"])) for points in seeds.values()]
        evaluations = min(len(points) for points in series)
        result[key] = [
            (statistics.mean(float(points[i]["tokens"]) for points in series),
             {name: mean_sd([float(points[i][name]) for points in series]) for name in METRIC_NAMES})
            for i in range(evaluations)
        ]
    return result


def drop_tokens(rows):
    """Mean token count at the DroPE switch of the rope-off runs, or None."""
    switches = [int(row["drope_step"]) * int(row["tokens_seen"]) / int(row["steps"])
                for row in rows if row["drope_step"] not in ("", None)]
    return statistics.mean(switches) if switches else None


def curve_panel(axis, series, name, attention, positions):
    """One mean line with a ±sd band: color = attention type, line style = position arm."""
    xs = [tokens for tokens, _ in series]
    means = [metrics[name][0] for _, metrics in series]
    sds = [metrics[name][1] for _, metrics in series]
    axis.plot(xs, means, marker="o", markersize=3, label=f"{attention} / {positions}", color=COLORS[attention],
              linestyle=ARM_STYLES[positions])
    axis.fill_between(xs, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)],
                      color=COLORS[attention], alpha=0.15)


def plot_curves(curves, rows, path):
    """Figures 3a-b: validation metrics at 1x (top) and 4x (bottom) against tokens seen, mean ± sd over seeds;
    color = attention, line style = position arm, dashed vertical line = the DroPE switch."""
    plt = pyplot()
    series = curve_groups(curves)
    switch = drop_tokens(rows)
    figure, axes = plt.subplots(len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4),
                                squeeze=False, layout="constrained")
    order = sorted(series, key=lambda k: (VARIANTS.index(k[0]), list(POSITION_ARMS).index(k[1])))
    for row_index, length in enumerate(LENGTHS):
        for col_index, name in enumerate(METRIC_NAMES):
            axis = axes[row_index][col_index]
            for attention, positions, key_length in order:
                if key_length == length:
                    curve_panel(axis, series[(attention, positions, length)], name, attention, positions)
            if switch is not None:
                axis.axvline(switch, color="grey", linestyle="--", linewidth=0.8)
            axis.set_title(f"{METRIC_LABELS[name]}, {LENGTHS[length]} length", fontsize=9)
            axis.set_xlabel("non-padding tokens seen", fontsize=8)
            axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    figure.suptitle("MLM: validation metrics during training (mean ± sd over seeds)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_drope(curves, rows, stats, path):
    """Figure 5: 4x-length validation curves of rope vs rope-off (top), test metrics at 4x with Welch's tests
    (bottom)."""
    plt = pyplot()
    grouped = groups(rows)
    attentions = [a for a in VARIANTS if (a, "rope") in grouped and (a, "rope-off") in grouped]
    series = curve_groups(curves, arms=("rope", "rope-off"))
    switch = drop_tokens(rows)
    drope_stats = [entry for entry in stats if entry["a"].split("/")[0] == entry["b"].split("/")[0]]
    figure, axes = plt.subplots(2, len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4), squeeze=False,
                                layout="constrained")
    for col_index, name in enumerate(METRIC_NAMES):
        axis = axes[0][col_index]
        for attention in attentions:
            for positions in ("rope", "rope-off"):
                curve_panel(axis, series[(attention, positions, "long")], name, attention, positions)
        if switch is not None:
            axis.axvline(switch, color="grey", linestyle="--", linewidth=0.8)
        axis.set_title(f"validation {METRIC_LABELS[name]}, 4x length", fontsize=9)
        axis.set_xlabel("non-padding tokens seen", fontsize=8)
        axis.grid(alpha=0.3)
        axis = axes[1][col_index]
        bar_panel(axis, grouped, drope_stats, attentions, ["rope", "rope-off"], lambda att, arm: (att, arm),
                  f"long_{name}")
        axis.set_title(f"test {METRIC_LABELS[name]}, 4x length", fontsize=9)
    axes[0][0].legend(fontsize=6)
    axes[1][0].legend(fontsize=7)
    figure.suptitle("MLM: DroPE (RoPE switched off at 70% of the budget) vs RoPE kept", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_context(rows, stats, path):
    """The context-extension axes in the bars layout: accuracy and loss at 1x and 4x, one panel each; clusters =
    position arm x setting, bars = attention variants (dual triangle per head routing), brackets = their Welch's
    tests."""
    plt = pyplot()
    grouped, categories = {}, []
    for (attention, positions, setting), group_rows in context_groups(rows).items():
        category = f"{positions}\n{setting_label(setting)}"
        categories += [category] if category not in categories else []
        grouped[(attention, category)] = {
            f"{length}_{name}": [float(row[f"test_{length}_{name}"]) for row in group_rows]
            for length in LENGTHS for name in METRIC_NAMES
        }
    attentions = [a for a in VARIANTS if any(key[0] == a for key in grouped)]
    attention_stats = [{**entry, "a": f"{entry['a']}/{entry['group'].replace(', ', chr(10))}",
                        "b": f"{entry['b']}/{entry['group'].replace(', ', chr(10))}"}
                       for entry in stats if entry["test"] == "attention"]
    panels = [(length, name) for name in ("accuracy", "mlm_loss") for length in LENGTHS]
    figure, axes = plt.subplots(len(panels), 1, figsize=(max(6.0, 0.9 * len(categories) + 1.5), 2.6 * len(panels)),
                                squeeze=False, layout="constrained")
    for index, (length, name) in enumerate(panels):
        axis = axes[index][0]
        bar_panel(axis, grouped, attention_stats, categories, attentions, lambda cat, att: (att, cat),
                  f"{length}_{name}")
        axis.tick_params(axis="x", labelsize=7)
        axis.set_title(f"test {METRIC_LABELS[name]}, {LENGTHS[length]} the training length", fontsize=9)
    axes[0][0].legend(fontsize=7)
    figure.suptitle("MLM context extension: attention x training length (L) x RoPE scaling at evaluation\n"
                    "(dual triangle per head routing; mean ± sd over seeds; Welch's t-test)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def write_outputs(out_dir: Path):
    """Summary, tables and figures from the two CSVs, so they can be redrawn without training. The Figures 3/4
    outputs use the reference setting (shortest training length, no scaling); the context-extension outputs
    (``mlm_context_*``) appear when the rows hold more than one setting."""
    all_rows = read_results(out_dir / RUNS_CSV)
    if not all_rows:
        logger.warning("no runs in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    rows = reference_rows(all_rows)
    reference_len = setting_of(rows[0])[0]
    curves = [point for point in read_results(out_dir / CURVES_CSV)
              if str(point.get("train_len") or "") == reference_len]
    stats = comparisons(rows)
    paths = {name: out_dir / name for name in
             ("mlm_summary.md", "mlm_table.csv", "mlm_stats.csv", "mlm_bars.png", "mlm_curves.png")}
    summary = summary_markdown(rows, stats)
    if len(settings(all_rows)) > 1:
        context_stats = context_comparisons(all_rows)
        summary += context_markdown(all_rows, context_stats)
        for name in ("mlm_context_table.csv", "mlm_context_stats.csv", "mlm_context.png"):
            paths[name] = out_dir / name
        write_csv(paths["mlm_context_table.csv"], context_table(all_rows))
        write_csv(paths["mlm_context_stats.csv"], context_stats)  # never empty: two settings give a setting test
        plot_context(all_rows, context_stats, paths["mlm_context.png"])
    paths["mlm_summary.md"].write_text(summary)
    write_csv(paths["mlm_table.csv"], table_rows(rows))
    if stats:
        write_csv(paths["mlm_stats.csv"], stats)
    else:
        del paths["mlm_stats.csv"]
    plot_bars(rows, stats, paths["mlm_bars.png"])
    plot_curves(curves, rows, paths["mlm_curves.png"])
    if any(entry["b"].endswith("/rope-off") for entry in stats):
        paths["mlm_drope.png"] = out_dir / "mlm_drope.png"
        plot_drope(curves, rows, stats, paths["mlm_drope.png"])
    return list(paths.values())


# ------------------------------------------------------------------------------------------------------------ CLI

def base_config(args) -> RunConfig:
    """The run config every arm starts from: --config, else the --domain's, with --data and --set applied."""
    overrides = ([f"data.source={args.data}"] if args.data else []) + args.overrides
    return load_run_config(args.config or DOMAINS[args.domain], overrides)


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.scaling_factor is not None and not args.scaling_factor >= 1:
        raise ValueError(f"--scaling-factor must be >= 1 (the context extension ratio), got {args.scaling_factor}")
    for seq_len in args.seq_lens or ():
        if seq_len < 2:
            raise ValueError(f"--seq-lens must be token counts >= 2, got {seq_len}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.plots_only:
        base = base_config(args)
        head_size = base_head_size(base, args.head_size)
        # The base length is the arm without a length suffix, so a sweep that adds lengths reuses its runs.
        seq_lens = [None if n == base.train.seq_len else n for n in args.seq_lens or [base.train.seq_len]]
        arms = grid(args.attention, args.positions, args.seeds, list(dict.fromkeys(seq_lens)), args.eval_scaling,
                    args.routing)
        sweep(arms, base, head_size, args.out_dir, workers=args.workers, factor=args.scaling_factor)
    for path in write_outputs(args.out_dir):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":  # python -m encoderlab.experiments.mlm_comparison ... runs encoderlab experiment mlm ...
    from ..cli import main

    sys.exit(main(["experiment", "mlm", *sys.argv[1:]]))
