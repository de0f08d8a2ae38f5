"""The plan of the MLM comparison: the arms (attention type x position arm x seed x training length x RoPE scaling
at evaluation x dual triangle routing), the grid of them a sweep trains, and the run config of each arm."""

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ...configuration.dta import ATTENTION_TYPES, DUAL_TRIANGLE_ROUTINGS, DTABertConfig
from ...training.run_config import PretrainRunConfig as RunConfig
from ..argmax.probe import heads_for
from .options import DEFAULT_ROUTING, POSITION_ARMS, SCALINGS

LENGTHS = {"short": "1x", "long": "4x"}
"""Each run is tested at its training length and at four times it."""
RUNS_CSV, CURVES_CSV = "mlm_runs.csv", "mlm_curves.csv"
ARM_FIELDS = ("attention", "positions", "seed", "train_len", "scaling", "routing")
"""The columns that identify a row of ``mlm_runs.csv``."""
VARIANTS = (*ATTENTION_TYPES, *(f"dual_triangle:{routing}" for routing in DUAL_TRIANGLE_ROUTINGS[1:]))
"""The attention axis of tables, tests and figures: the attention types, and dual triangle under each routing
other than the default (plain ``dual_triangle`` is the default routing)."""


def variant(attention, routing):
    """The `VARIANTS` entry of a run."""
    return (
        f"{attention}:{routing}" if attention == "dual_triangle" and routing not in ("", DEFAULT_ROUTING) else attention
    )


def variant_of(row):
    """The `VARIANTS` entry of a CSV row (rows of sweeps from before the routing axis have no routing)."""
    return variant(row["attention"], row.get("routing") or DEFAULT_ROUTING)


def split_variant(label):
    """{"attention", "routing"} of a `VARIANTS` entry; routing "-" where the attention type has none."""
    attention, _, routing = label.partition(":")
    return {"attention": attention, "routing": routing or (DEFAULT_ROUTING if attention == "dual_triangle" else "-")}


def row_label(row):
    return f"{variant_of(row)}-{row['positions']}-s{row['seed']} (L{row['train_len']}, {row['scaling']})"


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
        return (
            self.attention,
            self.positions,
            str(self.seed),
            str(self.seq_len or base_seq_len),
            self.scaling,
            self.routing,
        )


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
            raise ValueError(
                f"routing={routing!r} is not a dual triangle head routing; allowed: {DUAL_TRIANGLE_ROUTINGS}"
            )
    scalings = list(dict.fromkeys(["none", *scalings]))
    routings = list(dict.fromkeys(routings))
    return [
        Arm(a, p, s, n, k, r)
        for a in attentions
        for r in (routings if a == "dual_triangle" else [DEFAULT_ROUTING])
        for p in positions
        for n in seq_lens
        for s in seeds
        for k in scalings
        if k == "none" or p == "rope"
    ]


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
        raise ValueError(
            f"model.config.rope_scaling_type={base.model.config['rope_scaling_type']!r}: the MLM "
            "comparison trains without RoPE scaling and applies it at evaluation (--eval-scaling)"
        )
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
        train=dataclasses.replace(
            base.train, drope_fraction=drope_fraction, seed=arm.seed, seq_len=arm.seq_len or base.train.seq_len
        ),
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
