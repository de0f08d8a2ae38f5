"""``encoderlab prepare-data``: the data step of ``encoderlab pretrain`` alone, so a cluster job can tokenize on CPU
nodes before the GPU job starts.

It builds (or finds) the run's tokenizer and its tokenized shards in the shard cache (`encoderlab.training.shards`)
exactly as ``encoderlab pretrain`` would with the same run config, and writes nothing into ``output_dir``: the
pretraining run then finds both in the cache and starts training at once.
"""

import argparse
import json

from .pretrain import run_shards, run_tokenizer, validate_run
from .pretrain_command import add_config_arguments, check_without_torch
from .run_config import load_run_config
from .sources import check_local_source

# Imported inside functions (cost): accelerate and .shards (datasets), so that --help and check() answer without them
# (encoderlab/cli.py).


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the run config (`pretrain_command.check_without_torch`)."""
    check_without_torch(load_run_config(args.config, args.overrides))


def run(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from .shards import describe

    config = load_run_config(args.config, args.overrides)
    validate_run(config)
    check_local_source(config.data.source, text_field=config.data.text_field, split=config.data.split)
    state = PartialState()
    tokenizer = run_tokenizer(config, None, state)
    shards = run_shards(config, tokenizer, state)
    print(json.dumps(describe(shards), indent=1))
    return 0
