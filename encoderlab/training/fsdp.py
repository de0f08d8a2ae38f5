"""Sharded training with FSDP2, through accelerate and the HF Trainer.

The one way to run it: ``accelerate launch --config_file $(encoderlab config-path fsdp2) --num_processes N -m
encoderlab.cli pretrain ...`` (or ``finetune``). accelerate reads the config, sets its ``ACCELERATE_*`` / ``FSDP_*``
environment variables, and the Trainer's Accelerator shards the model with `fully_shard` (accelerate's
``fsdp2_prepare_model``): one FSDP unit per block named in the family's ``_no_split_modules``, checkpoints as
sharded state dicts (`torch.distributed.checkpoint`, each rank writes its part). This module adds what accelerate
and the Trainer leave out:

- `check_launch`, before anything is read or written: an FSDP launch where accelerate would quietly train DDP
  (no GPU: its state only switches to FSDP from multi-GPU types), FSDP version 1, a launch precision that
  contradicts ``train.precision``, block names that match no module of the model, or Muon under DeepSpeed ZeRO
  (which hands the optimizer flat partitions), each stop the run.
- `wrap_block_names`: the blocks of ``_no_split_modules`` this model has. accelerate wants every listed name to be
  present, and DSTG-NeoBERT lists both its DSTG and its NeoBERT block while a preset builds one of them;
  `configure_trainer` hands the present ones to accelerate's plugin.
- `gathered_state_dict`: the full weights on the main process, for the final plain ``save_pretrained`` folder
  (with a sharded state dict the Trainer's ``save_model`` writes no weights).
- `check_resume`: a sharded checkpoint is resumed only by an FSDP run with the number of processes that wrote it.

On CPU the same sharding is run without an Accelerator (`shard_model`), for the tests and the benchmark: the
plugin comes from the shipped config through accelerate's own launch code (`launch_environment`).
"""

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
from accelerate.utils.launch import prepare_multi_gpu_env
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.distributed.utils import gather_full_state_dict

from .trainer import use_bf16

FSDP_CHECKPOINT_DIR = "pytorch_model_fsdp_0"
"""Where accelerate's ``save_fsdp_model`` (called by the Trainer) puts a sharded model in a checkpoint."""
TRANSFORMER_BASED_WRAP = "TRANSFORMER_BASED_WRAP"
LAUNCH_PREFIXES = ("ACCELERATE_", "FSDP_")


def fsdp_requested(env=None) -> bool:
    """Whether the launcher asked for FSDP (`accelerate launch` with ``distributed_type: FSDP`` sets this). `env`:
    the process's environment, read when called (None), or a mapping of launch variables."""
    env = os.environ if env is None else env  # not a default: os.environ may be rebound after this module loads
    return env.get("ACCELERATE_USE_FSDP", "false").lower() in ("true", "1", "yes")


def check_launch(precision: str, build_meta_model, optimizer: str | None = None, env=None) -> None:
    """Raise, naming the setting, if this launch would not train as configured (call before any work).

    `precision` is ``train.precision``; `build_meta_model` builds the run's model (called on the meta device, so
    it allocates nothing) for the block-name check; `optimizer` is ``optimizer.name`` (None: the Trainer's AdamW);
    `env` as in `fsdp_requested`.
    """
    env = os.environ if env is None else env
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and optimizer == "muon":
        raise ValueError(
            "optimizer.name='muon' under DeepSpeed ZeRO: ZeRO hands the optimizer flat 1-D partitions of the "
            "weights, and Muon orthogonalises whole matrices; use optimizer.name=adamw, or FSDP2 (fsdp2 config)"
        )

    launched = env.get("ACCELERATE_MIXED_PRECISION", "no")
    if launched not in ("no", "bf16" if use_bf16(precision) else "no"):
        # The Trainer lets the launcher's precision win over bf16=False: the run would train in another precision.
        raise ValueError(
            f"the launcher asks for mixed_precision={launched!r} but train.precision={precision!r} trains "
            f"{'bf16' if use_bf16(precision) else 'fp32'} here; set train.precision=bf16 (or auto on a bf16 GPU), "
            "or launch with --mixed_precision no"
        )
    if not fsdp_requested(env):
        return
    version = env.get("FSDP_VERSION", "1")
    if version != "2":
        raise ValueError(f"fsdp_version={version!r}: encoderlab supports FSDP2 only (fsdp_version: 2, as in "
                         "`encoderlab config-path fsdp2`)")  # fmt: skip
    if not torch.cuda.is_available():
        raise ValueError(
            "distributed_type=FSDP needs GPUs: without one, accelerate trains every process with the whole model "
            "(DDP) and does not say so. Launch the CPU run with torchrun (data parallel), or run FSDP on GPUs"
        )
    if env.get("FSDP_AUTO_WRAP_POLICY") == TRANSFORMER_BASED_WRAP:
        with torch.device("meta"):
            model = build_meta_model()
        wrap_block_names(model, _split_names(env.get("FSDP_TRANSFORMER_CLS_TO_WRAP")))


def _split_names(text: str | None) -> list[str] | None:
    return None if not text else [name.strip() for name in text.split(",") if name.strip()]


def wrap_block_names(model: torch.nn.Module, requested: list[str] | None = None) -> list[str]:
    """The block classes to shard one by one: `requested` (the config's ``fsdp_transformer_layer_cls_to_wrap``),
    all of which must be in the model, or else those of the family's ``_no_split_modules`` that the model has."""
    present = {type(module).__name__ for module in model.modules()}
    if requested:
        missing = [name for name in requested if name not in present]
        if missing:
            raise ValueError(
                f"fsdp_transformer_layer_cls_to_wrap={requested}: {missing} is not a module of "
                f"{type(model).__name__}; leave it unset (the family's blocks {model._no_split_modules} are used)"
            )
        return list(requested)
    declared = list(getattr(model, "_no_split_modules", None) or [])
    names = [name for name in declared if name in present]
    if not names:
        raise ValueError(
            f"{type(model).__name__} has no module of its _no_split_modules={declared}: FSDP would have no block "
            "to shard; set fsdp_transformer_layer_cls_to_wrap to the class name of the model's blocks"
        )
    return names


def configure_trainer(trainer) -> None:
    """After the Trainer built its Accelerator, before training: FSDP is really on when the launcher asked for
    it (never DDP in its place), and the plugin wraps the blocks this model has."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if fsdp_requested() and plugin is None:
        raise RuntimeError(
            f"the launcher asked for FSDP, but accelerate set up {trainer.accelerator.distributed_type}; "
            "stopping instead of training without sharding"
        )
    if plugin is None:
        return
    if plugin.fsdp_version != 2:
        raise ValueError(f"fsdp_version={plugin.fsdp_version}: encoderlab supports FSDP2 only")

    if plugin.auto_wrap_policy is transformer_auto_wrap_policy:
        plugin.transformer_cls_names_to_wrap = wrap_block_names(trainer.model, plugin.transformer_cls_names_to_wrap)


def reshape_scalar_parameters(model: torch.nn.Module) -> torch.nn.Module:
    """Turn every 0-d parameter (DTA's U-Net scalars, HOMA's fusion gate) into a 1-element vector, in place:
    `fully_shard` refuses 0-d parameters. The models only multiply by them, and broadcasting a (1,) tensor gives
    the same results; `gathered_state_dict` gives the saved weights their shape back. Call before sharding."""
    names = getattr(model, "_fsdp_scalar_parameters", [])
    for module_name, module in model.named_modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if parameter.ndim == 0:
                vector = torch.nn.Parameter(parameter.detach().reshape(1), requires_grad=parameter.requires_grad)
                setattr(module, name, vector)
                names.append(f"{module_name}.{name}" if module_name else name)
    model._fsdp_scalar_parameters = names
    return model


def gathered_state_dict(model: torch.nn.Module) -> dict:
    """The full, unsharded weights on CPU on the main process ({} elsewhere), in the model's own shapes.
    Collective: every rank calls it."""
    weights = gather_full_state_dict(model)
    for name in getattr(model, "_fsdp_scalar_parameters", []):
        if name in weights:
            weights[name] = weights[name].reshape(())
    return weights


# ---------------------------------------------------------------------------------------------
# Resuming
# ---------------------------------------------------------------------------------------------


def sharded_checkpoint_world_size(checkpoint: Path) -> int | None:
    """The number of processes that wrote the sharded model of `checkpoint` (None: the checkpoint is not sharded).
    `torch.distributed.checkpoint` names each rank's file ``__<rank>_<n>.distcp``."""
    folder = Path(checkpoint) / FSDP_CHECKPOINT_DIR
    if not folder.is_dir():
        return None
    names = (re.fullmatch(r"__(\d+)_\d+\.distcp", path.name) for path in folder.iterdir())
    return len({match.group(1) for match in names if match})


def check_resume(checkpoint: Path, world_size: int, fsdp: bool) -> None:
    """A sharded checkpoint is resumed by an FSDP run with as many processes as wrote it; a plain one by a run
    without FSDP. (The step schedule, the data order and each rank's saved random state hang on the number of
    processes, so a different one is refused rather than resharded.)"""
    written_by = sharded_checkpoint_world_size(checkpoint)
    if written_by is None and fsdp:
        raise ValueError(f"--resume: {str(checkpoint)!r} is not sharded (written without FSDP); resume it without "
                         "FSDP, as it was trained")  # fmt: skip
    if written_by is not None and not fsdp:
        raise ValueError(f"--resume: {str(checkpoint)!r} holds a sharded FSDP checkpoint; resume it with the same "
                         "FSDP launch (accelerate launch --config_file $(encoderlab config-path fsdp2))")  # fmt: skip
    if written_by is not None and written_by != world_size:
        raise ValueError(
            f"--resume: {str(checkpoint)!r} was written by {written_by} processes, this run has {world_size}; "
            f"resume it with --num_processes {written_by}"
        )


# ---------------------------------------------------------------------------------------------
# The config as accelerate reads it, and sharding without an Accelerator (CPU tests, benchmark)
# ---------------------------------------------------------------------------------------------


def launch_environment(config_file: str | Path, launch_args: list[str] = ()) -> dict:
    """The ``ACCELERATE_*`` / ``FSDP_*`` variables `accelerate launch --config_file config_file *launch_args` gives
    its processes, computed by accelerate's own launch code (nothing is started)."""
    if not Path(config_file).is_file():
        raise FileNotFoundError(f"accelerate config file {str(config_file)!r} does not exist")
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(config_file), *launch_args, "-m", "encoderlab.cli"])
    inherited = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith(LAUNCH_PREFIXES)}
    try:  # as from a shell without a launch's variables (accelerate copies the environment it runs in)
        args, _, _ = _validate_launch_command(args)
        return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(LAUNCH_PREFIXES)}
    finally:
        os.environ.update(inherited)


@contextlib.contextmanager
def environment(variables: dict):
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def fsdp_plugin(variables: dict):
    """accelerate's `FullyShardedDataParallelPlugin` as a process launched with `variables` builds it."""
    with environment(variables):
        return FullyShardedDataParallelPlugin()


@dataclass
class _State:
    fsdp_plugin: object


@dataclass
class ShardingContext:
    """What accelerate's FSDP2 functions (``fsdp2_prepare_model``, ``save_fsdp_model``, ...) read of an
    Accelerator, for calling them on CPU, where the Accelerator itself would not shard (torch.distributed must be
    initialised)."""

    plugin: object
    mixed_precision: str = "no"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    torch_device_mesh = None

    def __post_init__(self):
        self.state = _State(self.plugin)
        self.process_index = torch.distributed.get_rank()
        self.num_processes = torch.distributed.get_world_size()
        self.is_main_process = self.process_index == 0

    def wait_for_everyone(self):
        torch.distributed.barrier()


def shard_model(model: torch.nn.Module, context: ShardingContext) -> torch.nn.Module:
    """`model` sharded as accelerate's Accelerator shards it (``_prepare_fsdp2``): the plugin's wrap policy with the
    model's blocks (`wrap_block_names`), activation checkpointing if the plugin asks, then ``fsdp2_prepare_model``."""
    plugin = context.plugin
    reshape_scalar_parameters(model)
    if plugin.auto_wrap_policy is transformer_auto_wrap_policy:
        plugin.transformer_cls_names_to_wrap = wrap_block_names(model, plugin.transformer_cls_names_to_wrap)
    plugin.set_auto_wrap_policy(model)
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(context, model)
    return fsdp2_prepare_model(context, model)
