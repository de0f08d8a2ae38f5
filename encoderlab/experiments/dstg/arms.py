"""The plan of the DSTG experiment: the arms (preset x seed) and the run config of each, from one base config."""

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from ...training.run_config import PretrainRunConfig as RunConfig
from ...training.run_config import load_run_config
from .options import ABLATION, DEFAULT_CONFIG

# Imported inside functions (cost): encoderlab.configuration (transformers), so that --help and check() answer without
# it (encoderlab/cli.py).

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
    from ...configuration.dstg import DSTG_AP_SIZE, DSTG_HIDDEN_SIZE

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


def grid(names, seeds):
    """Every arm of `names` with every seed of `seeds`, arm by arm."""
    return [Arm(name, seed) for name in names for seed in seeds]


def base_config(args) -> RunConfig:
    """--config with --data and --set applied; the CPU default falls back to the embedded corpus when the
    WikiText-2 file is not there."""
    overrides = ([f"data.source={args.data}"] if args.data else []) + args.overrides
    base = load_run_config(args.config, overrides)
    if args.config == DEFAULT_CONFIG and not args.data and base.data.source == str(WIKITEXT) and not WIKITEXT.is_file():
        logger.warning("%s not found: training on the embedded corpus instead", WIKITEXT)
        base = dataclasses.replace(base, data=dataclasses.replace(base.data, source="embedded"))
    return base
