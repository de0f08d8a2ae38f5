"""``encoderlab pretrain``: masked-language-model pretraining of any registered family with the HF Trainer.

A run is described by a YAML/JSON file with the sections of `RunConfig` (``model``, ``tokenizer``, ``data``,
``mlm``, ``optimizer``, ``train``) plus ``output_dir``, and ``--set section.key=value`` overrides
(`encoderlab.training.run_config`). This module orchestrates; the Trainer side is in
`encoderlab.training.trainer`, the run folder's checks and files in `encoderlab.training.run_folder`. The pipeline:

1. documents (`encoderlab.training.sources.load_documents`) split by document into train / validation / test;
2. the tokenizer: trained on the training split (``bpe``, ``wordpiece``) or built in code (``esm2``,
   ``tape_iupac``), or loaded from ``tokenizer.path``;
3. training examples of ``train.seq_len`` tokens; evaluation sets from the validation and test documents with
   at least ``data.long_factor`` x ``seq_len`` tokens, cut into windows of 1x ("short") and 4x ("long") the
   training length, masked once with a fixed seed so every evaluation scores the same positions;
4. the model: ``model.family`` names a registered family (`encoderlab.registry.FAMILIES`, by ``model_type``),
   ``model.config`` its configuration fields;
5. `transformers.Trainer` with the optimizer and schedule of `encoderlab.training.optim`, the token budget
   turned into optimizer steps, DroPE, periodic evaluation and checkpoints (``--resume`` continues the last one);
6. the run folder: model + tokenizer (loadable with ``AutoModelForMaskedLM`` / ``AutoTokenizer``), metrics CSV,
   training-curve PNG, ``results.json`` and a model card (README.md).
"""

import argparse
import inspect
import json
import logging
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..configuration.source_fields import family_fields
from ..run_files import is_local_path, read_run_record
from .lengths import check_lengths_fit
from .run_config import PretrainRunConfig, bundled_config_names, load_run_config
from .run_folder import (
    RunFinished,
    check_checkpoint_schedule,
    check_run_folder,
    last_checkpoint,
    save_run_config,
    save_training_log,
    start_run_folder,
    without_load_time_keys,
    write_results,
)
from .sources import check_source_exists


logger = logging.getLogger(__name__)

RunConfig = PretrainRunConfig
"""The schema of a pretraining run (the name the README and the experiments use)."""


# ---------------------------------------------------------------------------------------------
# Families, tokenizer, data
# ---------------------------------------------------------------------------------------------


def family_classes(family: str) -> tuple[type, type]:
    """(config class, masked-LM class) of the registered family whose ``model_type`` is `family`."""
    from encoderlab.registry import FAMILIES

    by_name = {config_class.model_type: config_class for config_class in FAMILIES}
    check_family_name(family, by_name)
    config_class = by_name[family]
    if "AutoModelForMaskedLM" not in FAMILIES[config_class]:
        raise ValueError(f"model.family={family!r} registers no AutoModelForMaskedLM class to pretrain")
    return config_class, FAMILIES[config_class]["AutoModelForMaskedLM"]


def check_family_name(family: str, registered) -> None:
    if family not in registered:
        raise ValueError(f"model.family={family!r} is not a registered family; allowed: {sorted(registered)}")


def check_config_keys(config: dict, allowed) -> None:
    """Every ``model.config`` key is a field of the family's configuration."""
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"Unknown key(s) {[f'model.config.{k}' for k in unknown]}; allowed: {sorted(allowed)}")


def _config_fields(config_class: type) -> set[str]:
    """Keyword arguments the family's config classes (encoderlab's own, not PreTrainedConfig) accept."""
    names = set()
    for klass in config_class.__mro__:
        if klass.__module__.startswith("encoderlab") and "__init__" in vars(klass):
            names.update(p for p in inspect.signature(klass.__init__).parameters if p not in ("self", "kwargs"))
    return names


def token_id_fields(config_class: type) -> list[str]:
    """The family config's fields that hold token ids (``pad_token_id``, DSTG's ``cls_token_id``, ...)."""
    return sorted(name for name in _config_fields(config_class) if name.endswith("_token_id"))


def build_model_config(run: RunConfig, tokenizer=None):
    """The family config of the run, its vocabulary size and token ids taken from `tokenizer`.

    Without a tokenizer it is a dry run: placeholder ids and the configured vocabulary size, so that every
    ``model.config`` key and value is checked before any data is read.
    """
    config_class, _ = family_classes(run.model.family)
    allowed = _config_fields(config_class)
    check_config_keys(run.model.config, allowed)
    id_fields = token_id_fields(config_class)
    derived = ["vocab_size", *id_fields, *(["special_token_ids"] if "special_token_ids" in allowed else [])]
    for name in derived:
        if name in run.model.config:
            raise ValueError(f"model.config.{name}={run.model.config[name]!r} is taken from the tokenizer; remove it")
    if tokenizer is None:
        # Distinct placeholders, padding first as in our tokenizers.
        ids = {name: index for index, name in enumerate(sorted(id_fields, key=lambda name: name != "pad_token_id"))}
        vocab_size = max(run.tokenizer.vocab_size, len(ids))
    else:
        ids, vocab_size = _tokenizer_ids(run, tokenizer, id_fields), len(tokenizer)
    # sparse_prediction unless the run config says otherwise: the LM head and the loss run on the ~15% masked
    # positions only, the same loss without vocabulary-wide logits for every token (at a 32k vocabulary and 768
    # wide, a fifth of a step's matrix work).
    fields = {"max_position_embeddings": run.train.seq_len * run.data.long_factor, "sparse_prediction": True,
              **run.model.config}
    try:
        config = config_class(vocab_size=vocab_size, **ids, **fields)
    except ValueError as error:  # the family's own check: say where in the run config the value is
        raise ValueError(f"model.config of family {run.model.family!r}: {error}") from error
    _check_ids_in_vocabulary(run, config, allowed)
    return config


def _tokenizer_ids(run: RunConfig, tokenizer, id_fields: list[str]) -> dict:
    """``{"cls_token_id": 2, ...}`` for every id field of the family, from the tokenizer's special tokens."""
    ids = {}
    for name in id_fields:
        token_id = getattr(tokenizer, name, None)
        if token_id is None:
            source = run.tokenizer.path or run.tokenizer.name
            raise ValueError(
                f"model.family={run.model.family!r} needs a {name.removesuffix('_id')} ({name}), but the tokenizer "
                f"{source!r} has none; use a tokenizer with one (tokenizer.name or tokenizer.path)"
            )
        ids[name] = token_id
    return ids


def _check_ids_in_vocabulary(run: RunConfig, config, allowed: set[str]) -> None:
    """Every token id the config holds is a token of the vocabulary (the family configs check most of them too)."""
    held = {name: getattr(config, name) for name in token_id_fields(type(config))}
    if "special_token_ids" in allowed:
        held.update({f"special_token_ids[{i}]": v for i, v in enumerate(config.special_token_ids)})
    for name, token_id in held.items():
        if token_id is not None and not 0 <= token_id < config.vocab_size:
            raise ValueError(
                f"model {run.model.family!r}: {name}={token_id} lies outside the vocabulary [0, {config.vocab_size})"
            )


def validate_run(run: RunConfig) -> None:
    """What the sections cannot check alone: the family and its config (a dry run), the attention kernel, the
    lengths the run will feed the model against its position limits (`lengths.check_lengths_fit`), then the local
    paths."""
    from ..modeling.attention import check_attention_implementation

    config = build_model_config(run)
    if run.train.attn_implementation is not None:  # a name the model cannot run stops here, before any write
        check_attention_implementation(config, run.train.attn_implementation, "train.attn_implementation")
    check_lengths_fit(config, fed_lengths(run), limit_prefix="model.config.",
                      remedy="lower data.long_factor or train.seq_len, or raise model.config.max_position_embeddings "
                      "(unset, it is the long evaluation length)")
    check_local_paths(run)


def check_local_paths(run: RunConfig) -> None:
    """A local corpus (``data.source``) and tokenizer (``tokenizer.path``) that do not exist are named; reads
    nothing, imports nothing heavy."""
    check_source_exists(run.data.source)
    path = run.tokenizer.path
    if path is not None and is_local_path(path) and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"tokenizer.path={path!r} does not exist; give a saved tokenizer's folder or a Hub "
                                "id, or leave it unset to build tokenizer.name")


def fed_lengths(run: RunConfig) -> dict[str, int]:
    """The input lengths a run feeds its model: training rows, and the long evaluation windows, which are also
    the tokenizer's ``model_max_length``."""
    long_factor, seq_len = run.data.long_factor, run.train.seq_len
    long_window = f"data.long_factor x train.seq_len = {long_factor} x {seq_len}"
    return {"train.seq_len": seq_len, long_window: long_factor * seq_len}


def build_tokenizer_for_run(run: RunConfig, train_documents: list[str]):
    from transformers import AutoTokenizer

    from encoderlab.tokenization import TRAINED_TOKENIZERS, build_tokenizer

    max_length = max(fed_lengths(run).values())
    if run.tokenizer.path is not None:
        return AutoTokenizer.from_pretrained(run.tokenizer.path, model_max_length=max_length)
    if run.tokenizer.name in TRAINED_TOKENIZERS:
        return build_tokenizer(
            run.tokenizer.name,
            train_documents,
            vocab_size=run.tokenizer.vocab_size,
            min_frequency=run.tokenizer.min_frequency,
            model_max_length=max_length,
        )
    return build_tokenizer(run.tokenizer.name, model_max_length=max_length)


@dataclass
class RunData:
    train: Any
    eval_sets: dict  # {"short": Dataset, "long": Dataset} from the validation documents
    test_sets: dict  # the same from the test documents
    documents: dict  # split name -> number of documents
    info: dict  # what the shards hold (`encoderlab.training.shards`): token counts, fill rate


def run_tokenizer(run: RunConfig, tokenizer_dir: Path | None, state):
    """The run's tokenizer: the one saved in `tokenizer_dir` (the folder of a resumed run), else the one cached for
    this corpus and tokenizer section (`encoderlab prepare-data` leaves it there), else built (a trained one from
    the training split, streamed) and cached. The main process builds it; the others, and resumed runs, load the
    saved one, so every process and every resumption uses the identical vocabulary."""
    from transformers import AutoTokenizer

    from .shards import cached_tokenizer_dir

    cached = cached_tokenizer_dir(run)
    with state.main_process_first():
        saved = next((d for d in (tokenizer_dir, cached) if d and (d / "tokenizer_config.json").is_file()), None)
        if saved is not None:
            tokenizer = AutoTokenizer.from_pretrained(saved)
        else:  # built by the main process; saved and read back, as every later run will read it
            save_atomically(build_tokenizer_for_run(run, training_documents(run)), cached)
            tokenizer = AutoTokenizer.from_pretrained(cached)
    return without_load_time_keys(tokenizer)  # saved with the model: no trace of how this process loaded it


def training_documents(run: RunConfig) -> Iterator[str]:
    """The training split of the run's corpus, streamed (documents placed by their hash, as in the shards)."""
    from .data import assign_split
    from .sources import load_documents

    documents = load_documents(run.data.source, text_field=run.data.text_field, split=run.data.split,
                               streaming=run.data.streaming, limit=run.data.limit)
    rule = dict(validation_size=run.data.validation_size, test_size=run.data.test_size, seed=run.train.seed)
    return (text for text in documents if assign_split(text, **rule) == "train")


def save_atomically(tokenizer, directory: Path) -> None:
    """Save into a side folder, then rename: a concurrent reader sees no tokenizer or a whole one."""
    import shutil
    import uuid

    side = directory.with_name(f"{directory.name}.partial-{uuid.uuid4().hex[:8]}")
    tokenizer.save_pretrained(side)
    try:
        side.rename(directory)
    except OSError:  # saved by another process meanwhile
        shutil.rmtree(side)


def prepare_data(run: RunConfig, tokenizer_dir: Path | None, state) -> tuple[Any, RunData]:
    """Tokenizer (reloaded from `tokenizer_dir` where it was saved) -> tokenized shards
    (`encoderlab.training.shards`), built once per corpus and settings and read memory-mapped by every process."""
    from .shards import load_or_build_shards

    tokenizer = run_tokenizer(run, tokenizer_dir, state)
    shards = load_or_build_shards(run, tokenizer, state)
    data = RunData(
        train=shards.train,
        eval_sets=shards.eval_sets,
        test_sets=shards.test_sets,
        documents=shards.info["documents"],
        info=shards.info,
    )
    return tokenizer, data


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------


def build_trainer(run: RunConfig, model, tokenizer, data: RunData, plan: dict, callbacks=()):
    from .callbacks import DroPECallback, drope_step
    from .collator import MLMCollator
    from .metrics import compute_metrics, preprocess_logits_for_metrics
    from .packing import PackedMLMCollator
    from .trainer import MLMTrainer, training_arguments

    drope = run.train.drope_fraction is not None and model.config.has_position_signal
    callbacks = list(callbacks)
    if drope:
        callbacks.append(DroPECallback(drope_step(run.train.drope_fraction, plan["max_steps"])))
    masking = dict(
        mlm_probability=run.mlm.probability,
        mask_replace_prob=run.mlm.mask_replace_prob,
        random_replace_prob=run.mlm.random_replace_prob,
    )
    args = training_arguments(run, plan["max_steps"], drope)
    if run.data.packing == "pack":  # rows of exactly seq_len tokens, positions restarting in every document
        collators = (PackedMLMCollator(tokenizer, row_length=run.train.seq_len, mask_on_device=True, **masking),
                     PackedMLMCollator(tokenizer, seed=run.train.seed, **masking))
        args.remove_unused_columns = False  # the collator reads each row's document lengths
    else:
        collators = (MLMCollator(tokenizer, mask_on_device=True, **masking),
                     MLMCollator(tokenizer, seed=run.train.seed, **masking))
    return MLMTrainer(
        model=model,
        args=args,
        data_collator=collators[0],
        eval_data_collator=collators[1],
        mask_seed=run.train.seed,
        train_dataset=data.train,
        eval_dataset=data.eval_sets,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        optimizer_settings=run.optimizer,
        callbacks=callbacks,
    )


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class PretrainResult:
    run_dir: Path
    results: dict
    trainer: Any


def pretrain(run: RunConfig, *, resume: bool = False, overwrite: bool = False, callbacks=(),
             command: str = "pretrain") -> PretrainResult:
    """Train, evaluate and save one run; see the module docstring. Returns the results and the Trainer.

    The whole run config is checked, and `run.output_dir` found usable (`run_folder.check_run_folder`), before
    any data is read or file written; the folder is claimed (`run_folder.start_run_folder`; with `overwrite` the
    encoderlab run it holds is replaced) only once the tokenizer and the data are ready, so a run that cannot start
    leaves no folder behind. `command` names the job that owns the folder. ``resume`` of a finished run raises
    `run_folder.RunFinished`.
    """
    from accelerate import PartialState
    from transformers import set_seed

    from ..modeling.attention import choose_attention
    from . import fsdp
    from .sources import check_local_source
    from .trainer import cpu_only, plan_steps, use_bf16

    validate_run(run)
    fsdp.check_launch(run.train.precision, lambda: family_classes(run.model.family)[1](build_model_config(run)),
                      run.optimizer.name)
    run_dir = Path(run.output_dir)
    # Without an accelerator, accelerate only forms a multi-process (gloo) group when told to run on CPU.
    state = PartialState(cpu=cpu_only())
    check_run_folder(run_dir, command, resume, run, overwrite)
    check_local_source(run.data.source, text_field=run.data.text_field, split=run.data.split)
    tokenizer, data = prepare_data(run, run_dir if resume else None, state)
    plan = plan_steps(data.train, run, state.num_processes)
    logger.info("Token budget %d -> %d optimizer steps (%s)", run.train.token_budget, plan["max_steps"], plan)
    checkpoint = last_checkpoint(run_dir) if resume else None
    if checkpoint is not None:
        check_checkpoint_schedule(checkpoint, plan["max_steps"])
        fsdp.check_resume(checkpoint, state.num_processes, fsdp.fsdp_requested())
    elif resume:
        logger.info("--resume: %s holds no checkpoint yet; training from step 0", run_dir)
    state.wait_for_everyone()  # every rank has checked and read its data before the main process writes
    if state.is_main_process:
        start_run_folder(run_dir, command, run, overwrite)
        if not (run_dir / "tokenizer_config.json").is_file():  # a resumed run keeps the tokenizer it started with
            tokenizer.save_pretrained(run_dir)
    state.wait_for_everyone()
    set_seed(run.train.seed)  # identical initial weights on every rank and in every resumption
    _, model_class = family_classes(run.model.family)
    model = model_class(build_model_config(run, tokenizer))
    attention = choose_attention(model.config, state.device, packed=run.data.packing == "pack",
                                 half_precision=use_bf16(run.train.precision), requested=run.train.attn_implementation)
    model.set_attn_implementation(attention.implementation)
    if state.is_main_process:
        logger.info(attention.line())
    if fsdp.fsdp_requested():
        fsdp.reshape_scalar_parameters(model)  # before the optimizer sees the parameters
    trainer = build_trainer(run, model, tokenizer, data, plan, callbacks)
    fsdp.configure_trainer(trainer)
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    results = _final_results(run, trainer, data, plan, tokenizer)
    results["attention"] = {"implementation": attention.implementation, "reason": attention.reason}
    weights = fsdp.gathered_state_dict(trainer.model) if trainer.is_fsdp_enabled else None  # every rank gathers
    if trainer.is_world_process_zero():
        _save_run(run, trainer, results, weights)
    trainer.accelerator.wait_for_everyone()
    return PretrainResult(run_dir=run_dir, results=results, trainer=trainer)


def _final_results(run: RunConfig, trainer, data: RunData, plan: dict, tokenizer) -> dict:
    """Validation and test metrics at 1x / 4x length, the unigram baseline, the copy-or-unigram floor on the test
    masks and the real token count."""
    from .callbacks import DroPECallback
    from .collator import special_token_ids_of
    from .metrics import evaluation_floor, unigram_baseline_accuracy
    from .shards import unigram_argmax_of

    validation = trainer.evaluate()
    test = trainer.evaluate(eval_dataset=data.test_sets, metric_key_prefix="test")
    top_token = unigram_argmax_of(data.info, special_token_ids_of(tokenizer))  # counted when the shards were built
    collate = trainer.eval_data_collator
    baseline = {
        name: unigram_baseline_accuracy(top_token, [collate(list(dataset))["labels"].numpy()])
        for name, dataset in data.test_sets.items()
    }
    floor = {name: evaluation_floor(collate, dataset, top_token) for name, dataset in data.test_sets.items()}
    callback = next((c for c in trainer.callback_handler.callbacks if isinstance(c, DroPECallback)), None)
    return {
        "family": run.model.family,
        "plan": plan,
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "steps": trainer.state.global_step,
        "documents": data.documents,
        "eval_examples": {name: len(ds) for name, ds in {**data.eval_sets, **_prefixed(data.test_sets)}.items()},
        "validation": _metrics_by_length(validation, "eval"),
        "test": _metrics_by_length(test, "test"),
        "unigram_baseline": {"token_id": top_token, "token": tokenizer.convert_ids_to_tokens(top_token), **baseline},
        "copy_or_unigram_floor": floor,
        "drope_step": None if callback is None else callback.switch_step,
        "seq_len": run.train.seq_len,
        "long_len": run.train.seq_len * run.data.long_factor,
    }


def _prefixed(sets: dict) -> dict:
    return {f"test_{name}": dataset for name, dataset in sets.items()}


def _metrics_by_length(metrics: dict, prefix: str) -> dict:
    """{"short": {...}, "long": {...}} from Trainer keys such as ``eval_short_accuracy``."""
    from .metrics import METRIC_NAMES

    return {
        length: {name: metrics[f"{prefix}_{length}_{name}"] for name in METRIC_NAMES}
        for length in ("short", "long")
    }


def _save_run(run: RunConfig, trainer, results: dict, weights: dict | None = None) -> None:
    """`weights`: the gathered weights of an FSDP run (its Trainer saves sharded checkpoints only)."""
    from encoderlab.hub_cards.card import build_model_card

    run_dir = Path(run.output_dir)
    if weights is None:
        trainer.save_model(str(run_dir))  # model, remote code, tokenizer
    else:
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(run_dir, state_dict=weights)
        trainer.processing_class.save_pretrained(run_dir)
    save_run_config(run_dir, run)
    write_results(run_dir, results)
    save_training_log(run_dir, trainer.state.log_history, title=f"{run.model.family}: {run_dir.name}")
    build_model_card(read_run_record(run_dir)).save(run_dir / "README.md")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .launch import accelerate_config_names

    add_config_arguments(parser)
    parser.epilog = (
        f"Several GPUs: shipped accelerate configs ({', '.join(accelerate_config_names())}), e.g. `accelerate launch "
        "--config_file $(encoderlab config-path fsdp2) --num_processes 8 -m encoderlab.cli pretrain --config ...` "
        "(FSDP2: sharded, GPUs only). CPU processes: torchrun --nproc_per_node N -m encoderlab.cli pretrain ..."
    )
    parser.add_argument("--output-dir", help="the run folder (= --set output_dir=DIR): new or empty, or an "
                        "encoderlab run to --resume or --overwrite; default: the config's output_dir")
    folder = parser.add_mutually_exclusive_group()
    folder.add_argument(
        "--resume", action="store_true",
        help="continue the run in output_dir from its last checkpoint (its saved run config must match)",
    )  # fmt: skip
    folder.add_argument("--overwrite", action="store_true", help="replace the encoderlab run in output_dir; it is "
                        "removed only once the new run has passed every check and read its data")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --set (also those of ``encoderlab prepare-data``)."""
    parser.add_argument(
        "--config", required=True,
        help="YAML/JSON run config, or the name of a bundled one "
        f"({', '.join(bundled_config_names(schema=RunConfig))}); required: there is no default run",
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


def check_without_torch(run: RunConfig) -> None:
    """The checks of a run config that the command line makes before importing torch, transformers and datasets,
    besides those its sections made when it was built: the family's name and ``model.config`` keys, against the
    built-in families' configuration source (`configuration.source_fields`; a family registered from Python is
    checked by `pretrain`), and the local paths. The run meets each check again."""
    fields = family_fields()
    check_family_name(run.model.family, fields)
    check_config_keys(run.model.config, fields[run.model.family])
    check_local_paths(run)


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the run config (`check_without_torch`) and the run
    folder."""
    config = load_run_config(args.config, command_line_overrides(args))
    check_without_torch(config)
    try:
        check_run_folder(Path(config.output_dir), "pretrain", args.resume, config, args.overwrite)
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
        resume = ["encoderlab", "pretrain", "--config", args.config, *(word for text in args.overrides
                  for word in ("--set", text)), "--output-dir", config.output_dir, "--resume"]
        print(f"\n{interrupted(config, shlex.join(resume))}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    print(format_results(result.results))
    print(f"Saved to {result.run_dir}")
    return 0


INTERRUPTED_EXIT_CODE = 130
"""The shell's code for a command stopped by Ctrl-C (128 + SIGINT)."""


def interrupted(run: RunConfig, resume_command: str) -> str:
    """The one line a run stopped by Ctrl-C prints: where it stopped and how to continue it."""
    from ..run_files import RUN_CONFIG_FILE, read_run_config
    from .run_folder import changed_keys

    run_dir = Path(run.output_dir)
    if not (run_dir / RUN_CONFIG_FILE).is_file() or changed_keys(read_run_config(run_dir), run.to_dict()):
        return (f"Interrupted before the run started: nothing was written to {run_dir}; run the same command "
                "again to start it")
    checkpoint = last_checkpoint(run_dir)
    where = ("no checkpoint yet (resuming trains from step 0)" if checkpoint is None
             else f"the last checkpoint is {checkpoint}")
    return f"Interrupted: {where}; continue with: {resume_command}"


def format_results(results: dict) -> str:
    """A plain-text table of the test metrics at 1x and 4x length next to the unigram baseline and the
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
