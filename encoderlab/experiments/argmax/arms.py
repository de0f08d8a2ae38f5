"""The plan of the argmax sweep: what identifies a run (`RunSpec`), the grid of runs the options ask for, and the
checks of those options. Imports no torch."""

from dataclasses import asdict, dataclass, fields

DROP_AFTER_CYCLES = 2


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


RESULT_FIELDS = (
    "heads",
    "parameters",
    "best_accuracy",
    "last_accuracy",
    "steps",
    "cycles",
    "drop_step",
    "wall_seconds",
)
CSV_FIELDS = tuple(field.name for field in fields(RunSpec)) + RESULT_FIELDS


def drop_step(spec):
    """Step after which a "-drop" run trains without positions; None for other schemes."""
    return DROP_AFTER_CYCLES * spec.cycle_steps if spec.positions.endswith("-drop") else None


def run_label(spec):
    return f"{spec.task}/{spec.attention}/{spec.positions}/h{spec.hidden_size}xL{spec.depth}/s{spec.seed}"


def row_label(row):
    return run_label(RunSpec(**{name.name: row[name.name] for name in fields(RunSpec)}))


def grid(args):
    """The RunSpecs of a sweep: the full grid for the task, plus random-label controls per `args.controls`."""
    shared = dict(
        batch_size=args.batch_size,
        cycle_steps=args.cycle_steps,
        max_cycles=args.max_cycles,
        patience=args.patience,
        warmup_steps=args.warmup_steps,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        eval_batches=args.eval_batches,
        head_size=args.head_size,
    )
    specs = [
        RunSpec("argmax", attention, positions, hidden, depth, seed, **shared)
        for attention in args.attention
        for positions in args.positions
        for hidden in args.hidden_sizes
        for depth in args.depths
        for seed in args.seeds
    ]
    if args.controls == "smallest":
        # One cheap control per attention type shows the floor without doubling the sweep.
        specs += [
            RunSpec(
                "random_labels",
                attention,
                args.positions[0],
                min(args.hidden_sizes),
                min(args.depths),
                args.seeds[0],
                **shared,
            )
            for attention in args.attention
        ]
    elif args.controls == "all":
        specs += [
            RunSpec("random_labels", s.attention, s.positions, s.hidden_size, s.depth, s.seed, **shared) for s in specs
        ]
    return specs


def finished_keys(rows):
    return {tuple(row[name] for name in (field.name for field in fields(RunSpec))) for row in rows}


def check_arguments(args):
    for name in (
        "hidden_sizes",
        "depths",
        "batch_size",
        "cycle_steps",
        "max_cycles",
        "patience",
        "eval_batches",
        "workers",
    ):
        values = getattr(args, name)
        if any(v <= 0 for v in (values if isinstance(values, list) else [values])):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {values}")
    if args.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if any(p.endswith("-drop") for p in args.positions) and args.max_cycles <= DROP_AFTER_CYCLES:
        raise ValueError(
            f"-drop schemes switch positions off after cycle {DROP_AFTER_CYCLES}; "
            f"--max-cycles={args.max_cycles} leaves no cycle without them"
        )
