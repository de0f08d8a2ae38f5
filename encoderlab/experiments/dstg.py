"""`encoderlab experiment dstg`: the DSTG paper's analyses (structural probes, head taxonomy, AP geometry,
attention component maps) on the four presets ``dstg``, ``ap``, ``rp``, ``rope`` trained alike, plus the
appendix B.2 ablation ``dstg-fullmlm`` (DSTG with the MLM head on the whole hidden state).

Every arm is the same base run config (`encoderlab.training.pretrain`: same corpus, tokenizer, budget, schedule)
with ``model.config.preset``, ``train.seed`` and ``output_dir`` set; the baselines get the semantic width
(``hidden_size - ap_size``) as their hidden size, as in the paper (720 = 768 - 48). Each arm trains into
``OUT/runs/<arm>-s<seed>``; rerunning skips finished arms and resumes an interrupted one from its last
checkpoint. Every finished arm is then analysed (`encoderlab.evaluation.dstg`) into ``OUT/analysis/<run>/``
(skipped when its files are there), and the summary is written from those files:

- ``dstg_runs.csv``: one row per trained run (test MLM metrics, steps, parameters);
- ``dstg_probes.csv`` (every probe R^2: run, space, layer, target, probe seed), ``dstg_heads.csv`` (normalised
  KL scores per head), ``dstg_geometry.csv`` (AP table PCA / DCT), ``dstg_components.csv``;
- ``dstg_summary.md``: Tables 2-4 in the paper's layout beside its numbers, the B.2 ablation, head counts, the
  AP table's variance and spectrum;
- figures: ``dstg_probes.png`` (per-layer lines), ``dstg_ablation.png`` (Figure 7), ``dstg_heads.png``
  (ternary, Figure 2), ``dstg_ap_table.png`` (appendix B.1), ``dstg_ap_states.png`` (Figure 4),
  ``dstg_components.png`` (Figure 3).

Usage::

    encoderlab experiment dstg --out-dir runs/dstg                      # the CPU default (dstg_cpu)
    encoderlab experiment dstg --config dstg_paper --out-dir runs/dstg_paper   # the paper's recipe, on GPUs
    encoderlab experiment dstg --summary-only --out-dir runs/dstg           # redraw from the CSVs
"""

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..results.rows import read_results, write_rows
from ..results.tables import markdown_lines
from ..training.pretrain import RunConfig, load_run_config, pretrain
from ..training.run_folder import RESULTS_FILE, RunFinished
from .dstg_options import ABLATION, ARMS, DEFAULT_CONFIG, add_arguments  # noqa: F401  (ARMS: re-exported)
from .sweeps import quiet_worker, run_jobs

logger = logging.getLogger(__name__)
WIKITEXT = Path("../shared/data/text/wikitext2_test.txt")


@dataclass(frozen=True)
class Arm:
    """One training run: an arm of `ARMS` and a seed."""

    name: str
    seed: int

    @property
    def run_name(self):
        return f"{self.name}-s{self.seed}"

    @property
    def preset(self):
        return "dstg" if self.name == ABLATION else self.name


def arm_config(base: RunConfig, arm: Arm, out_dir: Path) -> RunConfig:
    """The run of `arm`: the base config (a ``dstg`` model) with the arm's preset, width, seed and folder."""
    if base.model.family != "dstg_neobert":
        raise ValueError(f"model.family={base.model.family!r}: the DSTG experiment trains dstg_neobert presets")
    config = {key: value for key, value in base.model.config.items() if key not in ("preset", "mlm_on_full_hidden")}
    from ..configuration.dstg import DSTG_AP_SIZE, DSTG_HIDDEN_SIZE

    hidden_size = config.get("hidden_size", DSTG_HIDDEN_SIZE)
    ap_size = config.get("ap_size") or DSTG_AP_SIZE
    if arm.preset == "dstg":
        config.update(preset="dstg", hidden_size=hidden_size, ap_size=ap_size)
        if arm.name == ABLATION:  # its decoder reads AP + semantic: wider than the word embeddings
            config.update(mlm_on_full_hidden=True, tie_word_embeddings=False)
    else:  # the baselines are as wide as the DSTG semantic stream
        config.update(preset=arm.preset, hidden_size=hidden_size - ap_size, ap_size=None)
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, config=config),
        train=dataclasses.replace(base.train, seed=arm.seed),
        output_dir=str(out_dir / "runs" / arm.run_name),
    )


def train_arm(arm: Arm, run: RunConfig):
    """Train `arm` (resuming its last checkpoint), or read back its finished run; returns its row."""
    run_dir = Path(run.output_dir)
    try:
        results = pretrain(run, resume=run_dir.is_dir() and any(run_dir.iterdir())).results
    except RunFinished:
        results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    return run_row(arm, run, results)


def run_row(arm: Arm, run: RunConfig, results: dict):
    test = results["test"]["short"]
    return {"arm": arm.name, "preset": arm.preset, "seed": arm.seed, "run_dir": run.output_dir,
            "steps": results["steps"], "tokens_seen": results["tokens_seen"],
            "test_mlm_loss": test["mlm_loss"], "test_accuracy": test["accuracy"],
            "unigram_accuracy": results["unigram_baseline"]["short"],
            "floor_accuracy": results.get("copy_or_unigram_floor", {}).get("short", "")}  # "": a run before the floor


def finished(run: RunConfig):
    return (Path(run.output_dir) / RESULTS_FILE).is_file()


def train_all(arms, base: RunConfig, out_dir: Path, workers=1):
    """Train every arm that has not finished (in `workers` processes); returns the rows of all arms."""
    runs = {arm: arm_config(base, arm, out_dir) for arm in arms}
    todo = [(arm, run) for arm, run in runs.items() if not finished(run)]
    logger.info("%d of %d arms already trained; %d to go", len(arms) - len(todo), len(arms), len(todo))
    for row in run_jobs(train_arm, todo, workers, worker_setup=quiet_worker):
        logger.info("%s-s%s: test accuracy %.3f", row["arm"], row["seed"], float(row["test_accuracy"]))
    rows = [train_arm(arm, run) for arm, run in runs.items()]  # all finished now: read back
    write_rows(out_dir / "dstg_runs.csv", rows)
    return runs, rows


def base_config(args) -> RunConfig:
    """--config with --data and --set applied; the CPU default falls back to the embedded corpus when the
    WikiText-2 file is not there."""
    overrides = ([f"data.source={args.data}"] if args.data else []) + args.overrides
    base = load_run_config(args.config, overrides)
    if args.config == DEFAULT_CONFIG and not args.data and base.data.source == str(WIKITEXT) \
            and not WIKITEXT.is_file():
        logger.warning("%s not found: training on the embedded corpus instead", WIKITEXT)
        base = dataclasses.replace(base, data=dataclasses.replace(base.data, source="embedded"))
    return base


# ------------------------------------------------------------------------------------------------------- analyses

ANALYSIS_FILES = {"probes": "probes.csv", "heads": "heads.csv", "geometry": "ap_table.csv",
                  "components": "components.csv"}


def probe_texts(run: RunConfig):
    """The run's held-out documents (validation + test, split as `pretrain` split them): probe documents the model
    never trained on."""
    from ..training.data import split_documents
    from ..training.sources import load_documents

    documents = list(load_documents(run.data.source, text_field=run.data.text_field, split=run.data.split,
                                    streaming=run.data.streaming, limit=run.data.limit))
    splits = split_documents(documents, validation_size=run.data.validation_size, test_size=run.data.test_size,
                             seed=run.train.seed)
    return splits["validation"] + splits["test"]


def analyse_arm(arm: Arm, run: RunConfig, out_dir: Path, num_documents=500):
    """Every analysis that applies to the arm's checkpoint, into ``out_dir/analysis/<run>``; an analysis whose
    CSV is there is skipped. Probes: every arm; AP table geometry: arms with a learned table; heads, component
    maps and AP hidden states: the disentangled arms."""
    import numpy as np

    from ..evaluation.dstg import components, geometry, heads, probes
    from ..evaluation.dstg.documents import build_probe_documents
    from ..evaluation.dstg.states import load_checkpoint

    folder = out_dir / "analysis" / arm.run_name
    folder.mkdir(parents=True, exist_ok=True)
    todo = [name for name, file in ANALYSIS_FILES.items() if not (folder / file).is_file()]
    if arm.preset in ("rp", "rope"):
        todo = [name for name in todo if name == "probes"]
    elif arm.preset == "ap":
        todo = [name for name in todo if name in ("probes", "geometry")]
    if not todo:
        return folder
    logger.info("%s: analyses %s", arm.run_name, ", ".join(todo))
    model, tokenizer = load_checkpoint(run.output_dir)
    texts = probe_texts(run)
    if "probes" in todo:
        write_rows(folder / "probes.csv", probes.probe_checkpoint(model, tokenizer, texts, num_documents))
    if "heads" in todo:
        write_rows(folder / "heads.csv", heads.heads_checkpoint(model, tokenizer, texts, num_documents))
    if "geometry" in todo:
        table = geometry.position_table(model)
        np.save(folder / "ap_table.npy", table)
        if arm.preset == "dstg":
            document = build_probe_documents(texts, tokenizer, model.config.max_position_embeddings, 1)[0]
            projections = geometry.ap_state_projections(model, document)
            np.savez(folder / "ap_states.npz", segments=document.segments,
                     shares=[share for _, share in projections], **{f"layer{i}": points for i, (points, _) in
                                                                    enumerate(projections)})
        write_rows(folder / "ap_table.csv", geometry.geometry_rows(table))
    if "components" in todo:
        maps, spans, rows = components.components_checkpoint(model, tokenizer, texts)
        np.savez(folder / "components.npz", spans=np.array(spans), **maps)
        write_rows(folder / "components.csv", rows)
    return folder


def collect(out_dir: Path, runs_rows):
    """The per-arm CSVs of every trained run joined into ``dstg_<analysis>.csv`` with arm and training seed; a
    per-arm CSV's own ``seed`` (the probes' fitting seed) becomes ``probe_seed``."""
    collected = {}
    for row in runs_rows:
        folder = out_dir / "analysis" / f"{row['arm']}-s{row['seed']}"
        for name, file in ANALYSIS_FILES.items():
            for entry in read_results(folder / file):
                entry = {("probe_seed" if key == "seed" else key): value for key, value in entry.items()}
                collected.setdefault(name, []).append({"arm": row["arm"], "seed": row["seed"], **entry})
    for name, rows in collected.items():
        write_rows(out_dir / f"dstg_{name}.csv", rows)
    return collected


# -------------------------------------------------------------------------------------------------------- summary

PAPER_PROBES = {
    "position": {"rope": [0.10, 0.12, 0.32, 0.20, 0.18, 0.06], "rp": [0.17, 0.50, 0.46, 0.42, 0.42, 0.22],
                 "ap": [0.99, 0.99, 0.97, 0.89, 0.82, 0.24], "dstg": [0.99, 0.98, 0.96, 0.95, 0.92, None],
                 "dstg/ap": [0.99, 0.98, 0.95, 0.94, 0.89, None],
                 "dstg/semantic": [0.44, 0.34, 0.35, 0.32, 0.26, 0.18]},
    "segment": {"rope": [0.09, 0.11, 0.30, 0.19, 0.17, 0.06], "rp": [0.17, 0.47, 0.40, 0.37, 0.37, 0.23],
                "ap": [0.94, 0.95, 0.93, 0.85, 0.79, 0.23], "dstg": [0.94, 0.94, 0.92, 0.91, 0.88, None],
                "dstg/ap": [0.94, 0.93, 0.91, 0.90, 0.85, None],
                "dstg/semantic": [0.42, 0.33, 0.35, 0.31, 0.27, 0.18]},
    "intra_segment": {"rope": [0.29, 0.70, 0.73, 0.69, 0.68, 0.50], "rp": [0.50, 0.68, 0.67, 0.68, 0.63, 0.50],
                      "ap": [0.20, 0.76, 0.80, 0.76, 0.66, 0.46], "dstg": [0.43, 0.73, 0.76, 0.76, 0.73, None],
                      "dstg/ap": [0.04, 0.06, 0.06, 0.06, 0.06, None],
                      "dstg/semantic": [0.42, 0.73, 0.76, 0.75, 0.73, 0.58]},
}
"""Tables 2-4 of the paper (6 layers; None: the last-layer AP slice it leaves out)."""
PAPER_GEOMETRY = {"dstg": {"two_pcs": 0.941, "low_frequency": (0.984, 0.990)}, "ap": {"two_pcs": 0.234}}
PAPER_HEADS = "9 of 36 heads semantic, the other 27 strongly AP-affected, no RP-dominated head"
TABLE_ROWS = (("rope", "full", "RoPE"), ("rp", "full", "RP"), ("ap", "full", "AP"), ("dstg", "full", "DSTG"),
              ("dstg", "ap", "*AP only*"), ("dstg", "semantic", "*sem. only*"))
TABLE_NUMBERS = {"position": 2, "segment": 3, "intra_segment": 4}


def probe_means(probe_rows):
    """{(arm, space, target): {layer: (mean, sd, unconstrained)}} over probe seeds and training seeds."""
    from ..evaluation.dstg.probes import mean_table

    by_arm = {}
    for row in probe_rows:
        by_arm.setdefault(row["arm"], []).append(row)
    means = {}
    for arm, rows in by_arm.items():
        unconstrained = {(row["space"], int(row["layer"])) for row in rows if int(row["unconstrained"])}
        for (space, target), layers in mean_table(rows).items():
            means[(arm, space, target)] = {layer: (*value, (space, layer) in unconstrained)
                                           for layer, value in layers.items()}
    return means


def probe_cell(value, paper=None):
    """``"0.95 ± 0.01 (0.99)"``: ours (mean ± sd) and the paper's value; ``n/a`` where we have none."""
    if value is None:
        return "n/a"
    ours = f"{value[0]:.2f} ± {value[1]:.2f}"
    return ours if paper is None else f"{ours} ({paper:.2f})"


def probe_table(means, target):
    """Markdown Table 2/3/4: rows RoPE, RP, AP, DSTG, AP only, sem. only; cells 'ours (paper)'."""
    layers = sorted({layer for (arm, _, name), points in means.items() if name == target for layer in points})
    body = []
    for arm, space, label in TABLE_ROWS:
        points = means.get((arm, space, target))
        if points is None:
            continue
        key = arm if space == "full" else f"{arm}/{space}"
        paper = PAPER_PROBES[target].get(key, [])
        cells = []
        for layer in layers:
            value = points.get(layer)
            # the paper's last column is its last layer: line ours up from the end when depths differ
            paper_value = paper[layer - len(layers)] if len(paper) >= len(layers) else None
            hidden = arm == "dstg" and space in ("full", "ap") and layer == layers[-1]
            if hidden:  # the last layer's AP slice (and so the full state) is left out, as in the paper
                cells.append("- (-)")
            else:
                cells.append(probe_cell(value, paper_value))
        body.append([label, *cells])
    return markdown_lines([f"Table {TABLE_NUMBERS[target]}", *(f"layer {layer}" for layer in layers)], body)


def last_layer_note(means):
    """The values the tables leave out: DSTG's last-layer AP slice (and full state), per target."""
    notes = []
    for target in TABLE_NUMBERS:
        for space in ("ap", "full"):
            points = means.get(("dstg", space, target))
            if points:
                layer = max(points)
                notes.append(f"{target} {space}: {points[layer][0]:.2f}")
    return ", ".join(notes)


def ablation_table(means, target):
    """Appendix B.2 / Figure 7: DSTG with semantic-only MLM vs full-state MLM, AP and semantic subspaces, every
    layer (the last one included), with the AP baseline's full state for reference."""
    rows = [("dstg", "ap", "DSTG (sem. MLM): AP"), ("dstg", "semantic", "DSTG (sem. MLM): sem."),
            (ABLATION, "ap", "DSTG (full MLM): AP"), (ABLATION, "semantic", "DSTG (full MLM): sem."),
            ("ap", "full", "AP baseline")]
    layers = sorted({layer for (arm, _, name), points in means.items() if name == target for layer in points})
    body = []
    for arm, space, label in rows:
        points = means.get((arm, space, target))
        if points:
            body.append([label, *(f"{points[layer][0]:.2f}{'†' if points[layer][2] else ''}" if layer in points
                                  else "" for layer in layers)])
    return markdown_lines([target, *(f"layer {layer}" for layer in layers)], body)


def geometry_summary(geometry_rows):
    """{arm: (share of the first two PCs, [low-band share of PC1..3])}, each the mean over the arm's training
    seeds (rows come in component order per seed)."""
    per_seed = {}
    for row in geometry_rows:
        per_seed.setdefault(row["arm"], {}).setdefault(row["seed"], []).append(row)
    summary = {}
    for arm, seeds in per_seed.items():
        two = [float(rows[min(1, len(rows) - 1)]["cumulative_variance"]) for rows in seeds.values()]
        low = [[float(row["low_frequency_share"]) for row in rows[:3]] for rows in seeds.values()]
        summary[arm] = (sum(two) / len(two), [sum(column) / len(column) for column in zip(*low)])
    return summary


def summary_markdown(runs_rows, collected):
    from ..evaluation.dstg.heads import group_counts

    means = probe_means(collected.get("probes", []))
    first = runs_rows[0]
    lines = ["# DSTG analyses", "",
             f"{len(runs_rows)} runs, each {int(first['tokens_seen']):,} non-padding tokens in {first['steps']} "
             "steps. Cells: probe R² mean ± sd over probe seeds (and training seeds), the paper's value in "
             "brackets; `-`: DSTG's last-layer AP slice (and the full state containing it), left out as in the "
             "paper: with the MLM head on the semantic slice the last block's AP update gets no gradient.", "",
             "## Runs", ""]
    lines += markdown_lines(
        ["run", "steps", "test MLM loss", "test accuracy", "unigram accuracy", "copy-or-unigram floor"],
        [[f"{row['arm']}-s{row['seed']}", row["steps"], f"{float(row['test_mlm_loss']):.3f}",
          f"{float(row['test_accuracy']):.3f}", f"{float(row['unigram_accuracy']):.3f}",
          f"{float(row['floor_accuracy']):.3f}" if row.get("floor_accuracy") else "missing"] for row in runs_rows])
    titles = {"position": "Token-level AP (Table 2)", "segment": "Segment-level AP (Table 3)",
              "intra_segment": "Intra-segment AP (Table 4)"}
    for target, title in titles.items():
        lines += ["", f"## {title}", "", *probe_table(means, target)]
    lines += ["", f"Left out above (DSTG, last layer): {last_layer_note(means)}."]
    if any(arm == ABLATION for arm, _, _ in means):
        lines += ["", "## MLM on the full hidden state (appendix B.2, Figure 7)", "",
                  "† the last layer's AP slice of semantic-only DSTG (unconstrained by training).", ""]
        for target in ("position", "segment"):
            lines += [*ablation_table(means, target), ""]
    head_rows = collected.get("heads", [])
    if head_rows:
        body = []
        for arm in dict.fromkeys(row["arm"] for row in head_rows):
            for seed in dict.fromkeys(row["seed"] for row in head_rows if row["arm"] == arm):
                counts = group_counts([row for row in head_rows if row["arm"] == arm and row["seed"] == seed])
                body.append([f"{arm}-s{seed}", counts["semantic"], counts["ap"], counts["rp"]])
        lines += ["## Head taxonomy (Figure 2)", "", *markdown_lines(["run", "semantic", "AP", "RP"], body)]
        lines += ["", f"Paper: {PAPER_HEADS}."]
    geometry = geometry_summary(collected.get("geometry", []))
    if geometry:
        lines += ["", "## Learned position table (appendix B.1)", "",
                  "Means over the arm's training seeds.", ""]
        body = []
        for arm, (two, low) in geometry.items():
            paper = PAPER_GEOMETRY.get("dstg" if arm == "dstg" else arm)
            paper_text = "" if paper is None else f"{paper['two_pcs']:.1%}" + (
                f"; PC1 {paper['low_frequency'][0]:.1%}, PC2 {paper['low_frequency'][1]:.1%}"
                if "low_frequency" in paper else "; top PCs < 0.2% low-band")
            body.append([arm, f"{two:.1%}", ", ".join(f"{share:.1%}" for share in low), paper_text])
        lines += markdown_lines(["run", "variance in 2 PCs", "power in DCT bins 0-3: PC1, PC2, PC3", "paper"], body)
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------- figures

PROBE_LINES = (("rope", "full", "RoPE"), ("rp", "full", "RP"), ("ap", "full", "AP"), ("dstg", "ap", "DSTG: AP only"),
               ("dstg", "semantic", "DSTG: sem. only"))
ABLATION_LINES = (("dstg", "ap", "DSTG sem. MLM: AP"), ("dstg", "semantic", "DSTG sem. MLM: sem."),
                  (ABLATION, "ap", "DSTG full MLM: AP"), (ABLATION, "semantic", "DSTG full MLM: sem."),
                  ("ap", "full", "AP baseline"))


def line_series(means, lines):
    """{label: {target: {layer: (mean, sd)}}} for `plot_probe_lines`."""
    series = {}
    for arm, space, label in lines:
        for (mean_arm, mean_space, target), points in means.items():
            if (mean_arm, mean_space) == (arm, space):
                series.setdefault(label, {})[target] = {layer: value[:2] for layer, value in points.items()}
    return series


def write_figures(out_dir: Path, collected):
    """The figures of the summary, from the collected CSVs and the arrays saved per run (first seed)."""
    import numpy as np

    from ..evaluation.dstg import components, geometry, heads, probes

    paths = []
    means = probe_means(collected.get("probes", []))
    if means:
        paths.append(out_dir / "dstg_probes.png")
        probes.plot_probe_lines(line_series(means, PROBE_LINES), paths[-1],
                                "Structural probes per layer (DSTG's last AP layer is unconstrained)")
        if any(arm == ABLATION for arm, _, _ in means):
            paths.append(out_dir / "dstg_ablation.png")
            probes.plot_probe_lines(line_series(means, ABLATION_LINES), paths[-1],
                                    "MLM on the semantic slice vs the full hidden state (appendix B.2)")
    head_rows = collected.get("heads", [])
    if head_rows:
        panels = {}
        for row in head_rows:
            panels.setdefault(f"{row['arm']}-s{row['seed']}", []).append(
                {**row, "layer": int(row["layer"]),
                 **{f"share_{c}": float(row[f"share_{c}"]) for c in heads.COMPONENTS}})
        paths.append(out_dir / "dstg_heads.png")
        heads.plot_ternary(panels, paths[-1])
    folders = sorted((out_dir / "analysis").glob("*-s*"))
    tables = {folder.name: np.load(folder / "ap_table.npy") for folder in folders
              if (folder / "ap_table.npy").is_file()}
    if tables:
        paths.append(out_dir / "dstg_ap_table.png")
        geometry.plot_table(tables, paths[-1])
    for folder in folders:
        if folder.name.startswith("dstg-s") and (folder / "ap_states.npz").is_file():
            saved = np.load(folder / "ap_states.npz")
            layers = sorted((key for key in saved.files if key.startswith("layer")), key=lambda k: int(k[5:]))
            projections = [(saved[key], share) for key, share in zip(layers, saved["shares"])]
            paths.append(out_dir / "dstg_ap_states.png")
            geometry.plot_ap_states(projections, saved["segments"], paths[-1],
                                    f"{folder.name}: 2-D PCA of the AP hidden states, one document, colour = segment")
        if folder.name.startswith("dstg-s") and (folder / "components.npz").is_file():
            saved = np.load(folder / "components.npz")
            maps = {name: saved[name] for name in components.MAPS}
            paths.append(out_dir / "dstg_components.png")
            components.plot_maps(maps, [tuple(span) for span in saved["spans"]], paths[-1],
                                 f"{folder.name}, last layer: softmax of each component and of the sum, "
                                 "DOC-A + DOC-B + DOC-A")
        if paths and paths[-1].name == "dstg_components.png":
            break  # the first dstg seed is the one drawn
    return paths


# ------------------------------------------------------------------------------------------------------------ CLI

def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.documents < 5:
        raise ValueError(f"--documents must be >= 5 (probes fit on 4/5 of them), got {args.documents}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.summary_only:
        runs_rows = read_results(args.out_dir / "dstg_runs.csv")
        if not runs_rows:
            raise ValueError(f"{args.out_dir / 'dstg_runs.csv'} holds no runs; run without --summary-only first")
    else:
        base = base_config(args)
        arms = [Arm(name, seed) for name in args.arms for seed in args.seeds]
        runs, runs_rows = train_all(arms, base, args.out_dir, workers=args.workers)
        for arm, run_config in runs.items():
            analyse_arm(arm, run_config, args.out_dir, args.documents)
    collected = collect(args.out_dir, runs_rows)
    summary = args.out_dir / "dstg_summary.md"
    summary.write_text(summary_markdown(runs_rows, collected), encoding="utf-8")
    for path in [summary, *write_figures(args.out_dir, collected)]:
        logger.info("wrote %s", path)
    return 0

