"""``encoderlab pretrain``: the command line of `encoderlab.training.pretrain.pretrain`: its options, the checks of a
run config made before torch loads (`check`, `encoderlab.cli`), the run and what it prints (`run`,
`format_results`, `interrupted`)."""

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..configuration.source_fields import family_fields
from ..run_files import RUN_CONFIG_FILE, read_run_config
from .launch import accelerate_config_names
from .model_config import check_config_keys, check_family_name
from .pretrain import pretrain
from .run_config import PretrainRunConfig, bundled_config_names, load_run_config
from .run_folder import RunFinished, changed_keys, check_run_folder, last_checkpoint
from .sources import check_source_exists
from .tokenizer_cache import check_tokenizer_path

INTERRUPTED_EXIT_CODE = 130
"""The shell's code for a command stopped by Ctrl-C (128 + SIGINT)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.epilog = (
        f"Several GPUs: shipped accelerate configs ({', '.join(accelerate_config_names())}), e.g. `accelerate launch "
        "--config_file $(encoderlab config-path fsdp2) --num_processes 8 -m encoderlab.cli pretrain --config ...` "
        "(FSDP2: sharded, GPUs only). CPU processes: torchrun --nproc_per_node N -m encoderlab.cli pretrain ..."
    )
    parser.add_argument(
        "--output-dir",
        help="the run folder (= --set output_dir=DIR): new or empty, or an "
        "encoderlab run to --resume or --overwrite; default: the config's output_dir",
    )
    folder = parser.add_mutually_exclusive_group()
    folder.add_argument(
        "--resume", action="store_true",
        help="continue the run in output_dir from its last checkpoint (its saved run config must match)",
    )  # fmt: skip
    folder.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the encoderlab run in output_dir; it is "
        "removed only once the new run has passed every check and read its data",
    )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --set (also those of ``encoderlab prepare-data``)."""
    parser.add_argument(
        "--config", required=True,
        help="YAML/JSON run config, or the name of a bundled one "
        f"({', '.join(bundled_config_names(schema=PretrainRunConfig))}); required: there is no default run",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.seq_len=128 --set model.config.hidden_size=256",
    )  # fmt: skip


def command_line_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides, then ``--output-dir`` as ``output_dir``."""
    overrides = list(args.overrides)
    if args.output_dir is not None:  # JSON-quoted: read back as a string whatever the folder's name
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    return overrides


def check_without_torch(run: PretrainRunConfig) -> None:
    """The checks of a run config that the command line makes before importing torch, transformers and datasets,
    besides those its sections made when it was built: the family's name and ``model.config`` keys, against the
    built-in families' configuration source (`configuration.source_fields`; a family registered from Python is
    checked by `pretrain`), and the local corpus and tokenizer. The run meets each check again."""
    fields = family_fields()
    check_family_name(run.model.family, fields)
    check_config_keys(run.model.config, fields[run.model.family])
    check_source_exists(run.data.source)
    check_tokenizer_path(run.tokenizer.path)


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the run config (`check_without_torch`) and the run
    folder."""
    config = load_run_config(args.config, command_line_overrides(args))
    check_without_torch(config)
    try:
        check_run_folder(Path(config.output_dir), "pretrain", args.resume, config.to_dict(), args.overwrite)
    except RunFinished:
        pass  # not a mistake: `run` reports it


def run(args: argparse.Namespace) -> int:
    config = load_run_config(args.config, command_line_overrides(args))
    try:
        result = pretrain(config, resume=args.resume, overwrite=args.overwrite)
    except RunFinished as finished:
        print(f"Nothing to do: {finished}")
        return 0
    except KeyboardInterrupt:
        resume = [
            "encoderlab",
            "pretrain",
            "--config",
            args.config,
            *(word for text in args.overrides for word in ("--set", text)),
            "--output-dir",
            config.output_dir,
            "--resume",
        ]
        print(f"\n{interrupted(config, shlex.join(resume))}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    print(format_results(result.results))
    print(f"Saved to {result.run_dir}")
    return 0


def interrupted(run: PretrainRunConfig, resume_command: str) -> str:
    """The one line a run stopped by Ctrl-C prints: where it stopped and how to continue it."""
    run_dir = Path(run.output_dir)
    if not (run_dir / RUN_CONFIG_FILE).is_file() or changed_keys(read_run_config(run_dir), run.to_dict()):
        return (
            f"Interrupted before the run started: nothing was written to {run_dir}; run the same command "
            "again to start it"
        )
    checkpoint = last_checkpoint(run_dir)
    where = (
        "no checkpoint yet (resuming trains from step 0)"
        if checkpoint is None
        else f"the last checkpoint is {checkpoint}"
    )
    return f"Interrupted: {where}; continue with: {resume_command}"


def format_results(results: dict) -> str:
    """A plain-text table of the test metrics at both evaluation lengths next to the unigram baseline and the
    copy-or-unigram floor ("missing" in the results of runs from before the floor)."""
    header = f"{'test set':<22}{'mlm_loss':>10}{'accuracy':>10}{'mcc':>8}{'unigram acc':>13}{'floor acc':>11}"
    lines = [header, "-" * len(header)]
    floor = results.get("copy_or_unigram_floor", {})
    for length, tokens in (("short", results["seq_len"]), ("long", results["long_len"])):
        m = results["test"][length]
        baseline = results["unigram_baseline"][length]
        floor_cell = f"{floor[length]:>11.3f}" if length in floor else f"{'missing':>11}"
        lines.append(
            f"{f'{length} ({tokens} tokens)':<22}{m['mlm_loss']:>10.3f}{m['accuracy']:>10.3f}{m['mcc']:>8.3f}"
            f"{baseline:>13.3f}{floor_cell}"
        )
    lines.append(
        f"trained on {results['tokens_seen']:,} non-padding tokens in {results['steps']} steps "
        f"(budget {results['plan']['token_budget']:,})"
    )
    return "\n".join(lines)
