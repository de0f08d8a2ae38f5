"""The argmax position probe of the DTA paper (experiment 1): which attention patterns can locate a token?

Each sample is 64 tokens drawn uniformly from [1, 64]; the label is the index of the FIRST maximum. A model that
cannot tell positions apart can only guess, and its best guess is position 0 (ties go to the first occurrence),
which scores `POSITION_BLIND_CEILING` (~0.025), a bit above chance (1/64). Bidirectional attention without
position encodings is permutation-equivariant, so it stays at that ceiling; causal and dual triangle attention
see an asymmetric context and can learn the task without any position encoding.

The model is a `DTABertModel` body (pre-norm blocks, final norm) with the paper's softmax-pooling position head.
The sweep covers attention type x position scheme x hidden size x depth x seed; "-drop" schemes train with
positions and switch them off (DroPE) after the second evaluation cycle. Results go to a CSV (one row per run,
resumable), a Figure-1-style heatmap grid and a Figure-2a-style no-position line plot.

Run as ``encoderlab experiment argmax`` (or ``python -m encoderlab.cli experiment argmax``).
"""

import logging
import math
import time
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn
from tqdm.auto import tqdm

from ..configuration.dta import ATTENTION_TYPES, DTABertConfig
from ..modeling.dta import DTABertModel
from ..results.plots import pyplot
from ..results.rows import append_rows, read_results
from ..results.tables import markdown_lines
from .argmax_options import POSITION_SCHEMES, add_arguments  # noqa: F401
from .sweeps import run_jobs, runs_in_this_process

logger = logging.getLogger(__name__)

VOCAB = 64
SEQ_LEN = 64
TASKS = ("argmax", "random_labels")
CHANCE = 1.0 / SEQ_LEN
# P(first maximum at index 0) = sum_m P(x_0 = m) * P(all others <= m): the accuracy of always answering 0.
POSITION_BLIND_CEILING = sum((m / VOCAB) ** (SEQ_LEN - 1) for m in range(1, VOCAB + 1)) / VOCAB
DROP_AFTER_CYCLES = 2
EVAL_SEED = 20240917  # one held-out set for every run, independent of the run seeds


# ----------------------------------------------------------------------------------------------------------- data

def first_argmax(tokens):
    """Index of the first maximum of each row; spelled out instead of relying on torch.argmax's tie order."""
    is_max = tokens == tokens.max(dim=1, keepdim=True).values
    index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return torch.where(is_max, index, tokens.shape[1]).min(dim=1).values


def sample_batch(generator, batch_size, task="argmax"):
    """A fresh batch: tokens (B, 64) uniform in [1, 64] and labels (B,).

    ``task="random_labels"`` draws labels independently of the tokens: the control that measures what a model
    scores when there is nothing to learn.
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} must be one of {TASKS}")
    tokens = torch.randint(1, VOCAB + 1, (batch_size, SEQ_LEN), generator=generator)
    if task == "random_labels":
        return tokens, torch.randint(0, SEQ_LEN, (batch_size,), generator=generator)
    return tokens, first_argmax(tokens)


def evaluation_batches(num_batches, batch_size, task="argmax", seed=EVAL_SEED):
    """The fixed held-out set: the same seed gives the same batches on every call and in every run."""
    generator = torch.Generator().manual_seed(seed)
    return [sample_batch(generator, batch_size, task) for _ in range(num_batches)]


# ---------------------------------------------------------------------------------------------------------- model

class SoftmaxPoolingHead(nn.Module):
    """The paper's position head: score_i = w.h_i, alpha = softmax(score), logits = W (sum_i alpha_i h_i).

    A learned attention-pooling read-out: the model has to mark the answer position in its hidden states, and
    the classifier has to read the position back out of the pooled vector.
    """

    def __init__(self, hidden_size, num_classes=SEQ_LEN):
        super().__init__()
        self.score = nn.Linear(hidden_size, 1, bias=False)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def pooling_weights(self, hidden_states):
        """(B, L, D) -> alpha (B, L), each row a softmax over positions."""
        return self.score(hidden_states).squeeze(-1).softmax(dim=-1)

    def forward(self, hidden_states):
        alpha = self.pooling_weights(hidden_states)
        pooled = torch.einsum("bl,bld->bd", alpha, hidden_states)
        return self.classifier(pooled)


class ArgmaxProbe(nn.Module):
    """`DTABertModel` body + `SoftmaxPoolingHead`; returns logits over the 64 positions."""

    def __init__(self, config):
        super().__init__()
        self.body = DTABertModel(config)
        self.head = SoftmaxPoolingHead(config.hidden_size)

    def forward(self, input_ids):
        return self.head(self.body(input_ids=input_ids).last_hidden_state)


def heads_for(attention, hidden_size, head_size):
    """Heads of `head_size` channels (twice that for dual triangle, so each half-head has `head_size`); one head
    when the model is narrower than a head."""
    if head_size <= 0:
        raise ValueError(f"head_size={head_size} must be positive")
    width = 2 * head_size if attention == "dual_triangle" else head_size
    if hidden_size <= width:
        return 1
    if hidden_size % width:
        raise ValueError(f"hidden_size={hidden_size} is not a multiple of the {attention} head width {width}")
    return hidden_size // width


def build_probe(attention, positions, hidden_size, depth, head_size=64):
    """A fresh probe; `positions` is one of `POSITION_SCHEMES` (the "-drop" suffix only changes training)."""
    if positions not in POSITION_SCHEMES:
        raise ValueError(f"positions={positions!r} must be one of {POSITION_SCHEMES}")
    config = DTABertConfig(
        attention_type=attention,
        vocab_size=VOCAB + 1,  # id 0 is padding, never sampled
        hidden_size=hidden_size,
        num_hidden_layers=depth,
        num_attention_heads=heads_for(attention, hidden_size, head_size),
        position_embedding_type=positions.removesuffix("-drop"),
        max_position_embeddings=SEQ_LEN,
    )
    return ArgmaxProbe(config)


# ------------------------------------------------------------------------------------------------------- training

@dataclass(frozen=True)
class RunSpec:
    """Everything that identifies a run; two runs with equal specs are the same run (resume skips it)."""

    task: str
    attention: str
    positions: str
    hidden_size: int
    depth: int
    seed: int
    batch_size: int
    cycle_steps: int
    max_cycles: int
    patience: int
    warmup_steps: int
    learning_rate: float
    weight_decay: float
    eval_batches: int
    head_size: int

    def key(self):
        return tuple(str(value) for value in asdict(self).values())


RESULT_FIELDS = ("heads", "parameters", "best_accuracy", "last_accuracy", "steps", "cycles", "drop_step",
                 "wall_seconds")
CSV_FIELDS = tuple(field.name for field in fields(RunSpec)) + RESULT_FIELDS


def warmup_cosine(warmup_steps, total_steps):
    """LambdaLR factor: linear warmup, then cosine decay to 0 at `total_steps`."""
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    correct = sum(int((model(tokens).argmax(dim=-1) == labels).sum()) for tokens, labels in batches)
    model.train()
    return correct / sum(len(labels) for _, labels in batches)


def drop_step(spec):
    """Step after which a "-drop" run trains without positions; None for other schemes."""
    return DROP_AFTER_CYCLES * spec.cycle_steps if spec.positions.endswith("-drop") else None


def train_cycle(model, optimizer, schedule, generator, spec, bar):
    """`spec.cycle_steps` optimizer steps, each on a fresh batch (the task has unlimited data)."""
    for _ in range(spec.cycle_steps):
        tokens, labels = sample_batch(generator, spec.batch_size, spec.task)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.update(1)


def train_run(spec, progress=True):
    """Train one probe with early stopping on the fixed held-out set; returns the CSV row (dict)."""
    torch.manual_seed(spec.seed)
    model = build_probe(spec.attention, spec.positions, spec.hidden_size, spec.depth, spec.head_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(spec.warmup_steps, spec.cycle_steps * spec.max_cycles)
    )
    generator = torch.Generator().manual_seed(spec.seed)
    held_out = evaluation_batches(spec.eval_batches, spec.batch_size, spec.task)
    best, last, stale, step, start = 0.0, 0.0, 0, 0, time.perf_counter()
    bar = tqdm(total=spec.cycle_steps * spec.max_cycles, desc=run_label(spec), leave=False, disable=not progress)
    for cycle in range(1, spec.max_cycles + 1):
        train_cycle(model, optimizer, schedule, generator, spec, bar)
        step += spec.cycle_steps
        last = evaluate(model, held_out)
        stale = 0 if last > best else stale + 1
        best = max(best, last)
        bar.set_postfix(acc=f"{last:.3f}", best=f"{best:.3f}")
        if step == drop_step(spec):
            # From here on the model runs without positions; only those evaluations count for a "-drop" run,
            # and early stopping gets its full patience again.
            model.body.set_positions_enabled(False)
            best, stale = 0.0, 0
        if stale >= spec.patience:
            break
    bar.close()
    return {
        **asdict(spec),
        "heads": model.body.config.num_attention_heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "best_accuracy": round(best, 5),
        "last_accuracy": round(last, 5),
        "steps": step,
        "cycles": cycle,
        "drop_step": drop_step(spec) or "",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


def run_label(spec):
    return f"{spec.task}/{spec.attention}/{spec.positions}/h{spec.hidden_size}xL{spec.depth}/s{spec.seed}"


# ---------------------------------------------------------------------------------------------------------- sweep

def grid(args):
    """The RunSpecs of a sweep: the full grid for the task, plus random-label controls per `args.controls`."""
    shared = dict(batch_size=args.batch_size, cycle_steps=args.cycle_steps, max_cycles=args.max_cycles,
                  patience=args.patience, warmup_steps=args.warmup_steps, learning_rate=args.learning_rate,
                  weight_decay=args.weight_decay, eval_batches=args.eval_batches, head_size=args.head_size)
    specs = [
        RunSpec("argmax", attention, positions, hidden, depth, seed, **shared)
        for attention in args.attention for positions in args.positions
        for hidden in args.hidden_sizes for depth in args.depths for seed in args.seeds
    ]
    if args.controls == "smallest":
        # One cheap control per attention type shows the floor without doubling the sweep.
        specs += [RunSpec("random_labels", attention, args.positions[0], min(args.hidden_sizes), min(args.depths),
                          args.seeds[0], **shared) for attention in args.attention]
    elif args.controls == "all":
        specs += [RunSpec("random_labels", s.attention, s.positions, s.hidden_size, s.depth, s.seed, **shared)
                  for s in specs]
    return specs


def finished_keys(rows):
    return {tuple(row[name] for name in (field.name for field in fields(RunSpec))) for row in rows}


def sweep(specs, csv_path, progress=True, workers=1):
    """Run every spec not already in `csv_path`, appending a row as each run finishes (a crash loses only the
    runs in flight). With `workers` > 1 the runs go to that many processes, each with an equal share of the CPU
    threads; rows then arrive in completion order."""
    done = finished_keys(read_results(csv_path))
    todo = [spec for spec in specs if spec.key() not in done]
    logger.info("%d of %d runs already in %s; %d to go", len(specs) - len(todo), len(specs), csv_path, len(todo))
    bar = tqdm(total=len(todo), desc="argmax sweep", disable=not progress)
    progress_per_run = progress and runs_in_this_process(workers, len(todo))  # parallel bars would interleave
    for row in run_jobs(train_run, [(spec, progress_per_run) for spec in todo], workers):
        append_rows(csv_path, [row], CSV_FIELDS)
        bar.update(1)
        logger.info("%s: best %.3f last %.3f (%d steps, %.0f s)", row_label(row), row["best_accuracy"],
                    row["last_accuracy"], row["steps"], row["wall_seconds"])
    bar.close()
    return len(todo)


def row_label(row):
    return run_label(RunSpec(**{name.name: row[name.name] for name in fields(RunSpec)}))


# ---------------------------------------------------------------------------------------------------------- plots

def mean_accuracy(rows, metric="best_accuracy"):
    """{(attention, positions, hidden, depth): (mean, sd, n)} over seeds."""
    groups = {}
    for row in rows:
        key = (row["attention"], row["positions"], int(row["hidden_size"]), int(row["depth"]))
        groups.setdefault(key, []).append(float(row[metric]))
    summary = {}
    for key, values in groups.items():
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        summary[key] = (mean, sd, len(values))
    return summary


def draw_panel(axis, values, hiddens, depths):
    """One heatmap panel: rows hidden sizes, columns depths, each cell annotated with its accuracy."""
    image = axis.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    for y, row in enumerate(values):
        for x, value in enumerate(row):
            if not math.isnan(value):
                axis.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=9,
                          color="white" if value < 0.6 else "black")
    axis.set_xticks(range(len(depths)), depths)
    axis.set_yticks(range(len(hiddens)), hiddens)
    return image


def plot_heatmaps(rows, path):
    """Figure 1: a grid of panels, attention types down and position schemes across; each panel's cells are
    hidden size x depth with the mean best accuracy annotated."""
    plt = pyplot()

    summary = mean_accuracy(rows)
    attentions = [a for a in ATTENTION_TYPES if any(k[0] == a for k in summary)]
    schemes = [p for p in POSITION_SCHEMES if any(k[1] == p for k in summary)]
    hiddens = sorted({k[2] for k in summary})
    depths = sorted({k[3] for k in summary})
    # Panels at least ~1.5 inches, so one-cell grids (CPU sweeps) stay readable.
    size = (1.8 + max(1.5, 0.55 * len(depths)) * len(schemes), 0.8 + max(1.2, 0.45 * len(hiddens)) * len(attentions))
    figure, axes = plt.subplots(len(attentions), len(schemes), squeeze=False, figsize=size, layout="constrained")
    for row_index, attention in enumerate(attentions):
        for col_index, scheme in enumerate(schemes):
            values = [[summary.get((attention, scheme, h, d), (math.nan,))[0] for d in depths] for h in hiddens]
            axis = axes[row_index][col_index]
            image = draw_panel(axis, values, hiddens, depths)
            if row_index == 0:
                axis.set_title(f"positions: {scheme}", fontsize=9)
            if row_index == len(attentions) - 1:
                axis.set_xlabel("layers")
            if col_index == 0:
                axis.set_ylabel(f"{attention}\nhidden size", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.8, label="best held-out accuracy (mean over seeds)")
    figure.savefig(path, dpi=150)
    plt.close(figure)


def plot_no_position(rows, path):
    """Figure 2a: accuracy without positions vs parameter count, one line per attention type, with chance and
    the position-blind ceiling as reference lines."""
    plt = pyplot()

    rows = [row for row in rows if row["positions"] == "none"]
    sizes = {(int(r["hidden_size"]), int(r["depth"])): int(r["parameters"]) for r in rows}
    summary = mean_accuracy(rows)
    figure, axis = plt.subplots(figsize=(6, 4))
    for attention in ATTENTION_TYPES:
        points = sorted((sizes[k[2:]], *summary[k], f"{k[2]}x{k[3]}") for k in summary if k[0] == attention)
        if points:
            x, mean, sd = [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]
            axis.errorbar(x, mean, yerr=sd, marker="o", capsize=3, label=attention)
    axis.axhline(CHANCE, color="grey", linestyle=":", label=f"chance 1/{SEQ_LEN}")
    axis.axhline(POSITION_BLIND_CEILING, color="red", linestyle="--",
                 label=f"position-blind ceiling {POSITION_BLIND_CEILING:.3f}")
    axis.set_xscale("log")
    axis.set_xlabel("parameters")
    axis.set_ylabel("best held-out accuracy")
    axis.set_title("argmax probe without position encodings")
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def summary_table(rows):
    """Markdown table: best held-out accuracy, mean +- sd over seeds, for every task x configuration."""
    body = []
    for task in TASKS:
        summary = mean_accuracy([row for row in rows if row["task"] == task])
        order = sorted(summary, key=lambda k: (ATTENTION_TYPES.index(k[0]), POSITION_SCHEMES.index(k[1]), k[2:]))
        for attention, positions, hidden, depth in order:
            mean, sd, n = summary[(attention, positions, hidden, depth)]
            body.append([task, attention, positions, hidden, depth, n, f"{mean:.3f} +- {sd:.3f}"])
    lines = markdown_lines(["task", "attention", "positions", "hidden", "layers", "seeds",
                            "best accuracy (mean +- sd)"], body)
    lines.append(f"\nChance is {CHANCE:.3f} (1/{SEQ_LEN}); in expectation a model blind to positions can reach at most "
                 f"{POSITION_BLIND_CEILING:.3f} by always answering position 0.")
    lines += [f"On the {size} held-out examples of {batches} x {batch_size}, the best constant answer scores "
              f"{score:.3f}; taking the best of several evaluations adds upward noise on top."
              for batches, batch_size, size, score in _constant_answer_scores(rows)]
    return "\n".join(lines) + "\n"


def best_constant_score(labels):
    """Accuracy of always answering the most frequent label: what a position-blind model can score on a finite
    evaluation set, where the realised label counts differ from their expectation."""
    return torch.bincount(labels, minlength=SEQ_LEN).max().item() / labels.numel()


def _constant_answer_scores(rows):
    """(batches, batch_size, examples, best constant score) for every evaluation set the runs used."""
    sizes = sorted({(int(row["eval_batches"]), int(row["batch_size"])) for row in rows if row["task"] == "argmax"})
    scores = []
    for batches, batch_size in sizes:
        labels = torch.cat([labels for _, labels in evaluation_batches(batches, batch_size)])
        scores.append((batches, batch_size, labels.numel(), best_constant_score(labels)))
    return scores


def write_outputs(csv_path, out_dir):
    """The summary table and the two figures, all from the CSV (so they can be redrawn without training)."""
    rows = read_results(csv_path)
    task_rows = [row for row in rows if row["task"] == "argmax"]
    if not rows:
        logger.warning("no runs in %s; nothing to summarise", csv_path)
        return []
    paths = [out_dir / "argmax_summary.md"]
    paths[0].write_text(summary_table(rows))
    if task_rows:
        paths += [out_dir / "argmax_heatmaps.png", out_dir / "argmax_no_position.png"]
        plot_heatmaps(task_rows, paths[1])
        plot_no_position(task_rows, paths[2])
    return paths


# ------------------------------------------------------------------------------------------------------------ CLI

def check_arguments(args):
    for name in ("hidden_sizes", "depths", "batch_size", "cycle_steps", "max_cycles", "patience", "eval_batches",
                 "workers"):
        values = getattr(args, name)
        if any(v <= 0 for v in (values if isinstance(values, list) else [values])):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {values}")
    if args.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if any(p.endswith("-drop") for p in args.positions) and args.max_cycles <= DROP_AFTER_CYCLES:
        raise ValueError(f"-drop schemes switch positions off after cycle {DROP_AFTER_CYCLES}; "
                         f"--max-cycles={args.max_cycles} leaves no cycle without them")


def run(args):
    check_arguments(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = args.out_dir / "argmax_runs.csv"
    if not args.plots_only:
        sweep(grid(args), csv_path, progress=not args.no_progress, workers=args.workers)
    for path in write_outputs(csv_path, args.out_dir):
        logger.info("wrote %s", path)
    return 0

