"""The accelerate configs shipped with encoderlab, and ``encoderlab config-path NAME`` (torch-free).

``ddp`` and ``fsdp2`` are `accelerate launch` configs for machines with GPUs, used as
``accelerate launch --config_file $(encoderlab config-path fsdp2) --num_processes 8 -m encoderlab.cli pretrain ...``.
There is no CPU variant of ``fsdp2``: accelerate would run it as DDP, so encoderlab refuses it there
(`encoderlab.training.fsdp.check_launch`).
"""

import argparse
from pathlib import Path

ACCELERATE_CONFIG_DIR = Path(__file__).with_name("accelerate_configs")


def accelerate_config_names(config_dir: Path = ACCELERATE_CONFIG_DIR) -> list[str]:
    return sorted(path.stem for path in config_dir.glob("*.yaml"))


def accelerate_config_path(name: str, config_dir: Path = ACCELERATE_CONFIG_DIR) -> Path:
    """The file of the shipped accelerate config `name` (``ddp``, ``fsdp2``)."""
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"accelerate config {name!r} is not shipped; allowed: {accelerate_config_names(config_dir)}")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of {', '.join(accelerate_config_names())}")


def run(args: argparse.Namespace) -> int:
    print(accelerate_config_path(args.name))
    return 0
