"""Masked-language-model pretraining of any registered family with the HF Trainer (``encoderlab pretrain``, whose
command line is `encoderlab.training.pretrain_command`).

A run is described by a YAML/JSON file with the sections of `RunConfig` (``model``, ``tokenizer``, ``data``,
``mlm``, ``optimizer``, ``train``) plus ``output_dir``, and ``--set section.key=value`` overrides
(`encoderlab.training.run_config`). This module orchestrates: it is where the run config is read, and the modules
it calls take the values they need (`PretrainLengths`, `Corpus`, `ShardSpec`, sections, plain values). The
pipeline:

1. documents (`encoderlab.training.sources.load_documents`) split by document into train / validation / test;
2. the tokenizer (`encoderlab.training.tokenizer_cache`): trained on the training split (``bpe``, ``wordpiece``) or
   built in code (``esm2``, ``tape_iupac``), or loaded from ``tokenizer.path``;
3. training rows of ``train.seq_len`` tokens (`encoderlab.training.shards`); evaluation sets from the validation
   and test documents with at least ``data.long_factor`` x ``seq_len`` tokens, cut into windows of 1x ("short")
   and ``long_factor`` x ("long") the training length (`encoderlab.training.lengths.PretrainLengths`), masked once
   with a fixed seed so every evaluation scores the same positions;
4. the model: ``model.family`` names a registered family (`encoderlab.registry.FAMILIES`, by ``model_type``),
   ``model.config`` its configuration fields (`encoderlab.training.model_config`);
5. `transformers.Trainer` (`encoderlab.training.trainer`) with the optimizer and schedule of
   `encoderlab.training.optim`, the token budget turned into optimizer steps, DroPE, periodic evaluation and
   checkpoints (``--resume`` continues the last one);
6. the run folder (`encoderlab.training.run_folder`): model + tokenizer (loadable with ``AutoModelForMaskedLM`` /
   ``AutoTokenizer``), metrics CSV, training-curve PNG, ``results.json`` and a model card (README.md).

The module body imports nothing heavy (the experiments' command-line options import it); torch, transformers,
datasets and the modules that load them are imported by the steps that use them.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..run_files import read_run_record
from .lengths import PretrainLengths, check_lengths_fit
from .model_config import dry_run_config, family_classes, model_config
from .run_config import PretrainRunConfig, load_run_config
from .run_folder import (
    check_checkpoint_schedule,
    check_run_folder,
    last_checkpoint,
    save_run_config,
    save_training_log,
    start_run_folder,
    write_results,
)
from .sources import check_local_source, check_source_exists
from .tokenizer_cache import check_tokenizer_path, load_or_build_tokenizer

# Imported inside functions (cost): torch, transformers, datasets, accelerate and the modules of training/ that load
# them, so that --help and check() answer without them (encoderlab/cli.py).

__all__ = [
    "PretrainResult",
    "RunConfig",
    "RunData",
    "build_model_config",
    "load_run_config",
    "prepare_data",
    "pretrain",
    "run_corpus",
    "run_lengths",
    "run_shard_spec",
    "run_shards",
    "run_tokenizer",
    "validate_run",
]

logger = logging.getLogger(__name__)

RunConfig = PretrainRunConfig
"""The schema of a pretraining run (the name the README and the experiments use)."""


# ---------------------------------------------------------------------------------------------
# The values of a run
# ---------------------------------------------------------------------------------------------


def run_lengths(run: RunConfig) -> PretrainLengths:
    return PretrainLengths(seq_len=run.train.seq_len, long_factor=run.data.long_factor)


def run_corpus(run: RunConfig):
    """The `data.Corpus` of the run: its documents and split rule."""
    from .data import Corpus

    data = run.data
    return Corpus(
        source=data.source,
        text_field=data.text_field,
        split=data.split,
        streaming=data.streaming,
        limit=data.limit,
        validation_size=data.validation_size,
        test_size=data.test_size,
        seed=run.train.seed,
    )


def run_shard_spec(run: RunConfig):
    """The `shards.ShardSpec` of the run: what decides its shards' content, the tokenizer aside."""
    from .shards import ShardSpec

    data = run.data
    return ShardSpec(
        corpus=run_corpus(run),
        lengths=run_lengths(run),
        packing=data.packing,
        max_eval_examples=data.max_eval_examples,
        shard_rows=data.shard_rows,
    )


def build_model_config(run: RunConfig, tokenizer=None):
    """The family config of the run, its vocabulary size and token ids taken from `tokenizer`. Without a tokenizer
    it is a dry run (`model_config.dry_run_config`), so that every ``model.config`` key and value is checked before
    any data is read."""
    model, max_length = run.model, run_lengths(run).long_seq_len
    if tokenizer is None:
        return dry_run_config(model.family, model.config, max_length, run.tokenizer.vocab_size)
    return model_config(model.family, model.config, max_length, tokenizer, run.tokenizer.path or run.tokenizer.name)


def validate_run(run: RunConfig) -> None:
    """What the sections cannot check alone: the family and its config (a dry run), the attention kernel, the
    lengths the run will feed the model against its position limits (`lengths.check_lengths_fit`), then the local
    corpus and tokenizer."""
    from ..modeling.attention import check_attention_implementation

    config = build_model_config(run)
    if run.train.attn_implementation is not None:  # a name the model cannot run stops here, before any write
        check_attention_implementation(config, run.train.attn_implementation, "train.attn_implementation")
    check_lengths_fit(
        config,
        run_lengths(run).fed(),
        limit_prefix="model.config.",
        remedy="lower data.long_factor or train.seq_len, or raise model.config.max_position_embeddings "
        "(unset, it is the long evaluation length)",
    )
    check_source_exists(run.data.source)
    check_tokenizer_path(run.tokenizer.path)


# ---------------------------------------------------------------------------------------------
# Tokenizer and data
# ---------------------------------------------------------------------------------------------


@dataclass
class RunData:
    train: Any
    eval_sets: dict  # {"short": Dataset, "long": Dataset} from the validation documents
    test_sets: dict  # the same from the test documents
    documents: dict  # split name -> number of documents
    info: dict  # what the shards hold (`encoderlab.training.shards`): token counts, fill rate


def run_tokenizer(run: RunConfig, tokenizer_dir: Path | None, state):
    """The run's tokenizer (`tokenizer_cache.load_or_build_tokenizer`): the one saved in `tokenizer_dir` (the folder
    of a resumed run), else the one cached for this corpus and tokenizer section, else built and cached."""
    from .shards import cache_root, cached_tokenizer_dir

    corpus, max_length = run_corpus(run), run_lengths(run).long_seq_len
    cached = cached_tokenizer_dir(cache_root(run.data.cache_dir), corpus, run.tokenizer, max_length)
    return load_or_build_tokenizer(
        run.tokenizer, lambda: corpus.documents_of("train"), max_length, cached, tokenizer_dir, state
    )


def run_shards(run: RunConfig, tokenizer, state=None):
    """The run's tokenized shards (`shards.load_or_build_shards`), built first if the cache has none."""
    from .shards import cache_root, load_or_build_shards

    return load_or_build_shards(
        run_shard_spec(run), tokenizer, cache_root(run.data.cache_dir), num_proc=run.data.num_proc, state=state
    )


def prepare_data(run: RunConfig, tokenizer_dir: Path | None, state) -> tuple[Any, RunData]:
    """Tokenizer (reloaded from `tokenizer_dir` where it was saved) -> tokenized shards, built once per corpus and
    settings and read memory-mapped by every process."""
    tokenizer = run_tokenizer(run, tokenizer_dir, state)
    shards = run_shards(run, tokenizer, state)
    data = RunData(
        train=shards.train,
        eval_sets=shards.eval_sets,
        test_sets=shards.test_sets,
        documents=shards.info["documents"],
        info=shards.info,
    )
    return tokenizer, data


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class PretrainResult:
    run_dir: Path
    results: dict
    trainer: Any


def pretrain(
    run: RunConfig, *, resume: bool = False, overwrite: bool = False, callbacks=(), command: str = "pretrain"
) -> PretrainResult:
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
    from .callbacks import drope_step
    from .trainer import build_trainer, cpu_only, plan_steps, training_arguments, use_bf16

    validate_run(run)
    fsdp.check_launch(
        run.train.precision, lambda: family_classes(run.model.family)[1](build_model_config(run)), run.optimizer.name
    )
    run_dir, train, lengths = Path(run.output_dir), run.train, run_lengths(run)
    # Without an accelerator, accelerate only forms a multi-process (gloo) group when told to run on CPU.
    state = PartialState(cpu=cpu_only())
    check_run_folder(run_dir, command, resume, run.to_dict(), overwrite)
    check_local_source(run.data.source, text_field=run.data.text_field, split=run.data.split)
    tokenizer, data = prepare_data(run, run_dir if resume else None, state)
    plan = plan_steps(
        data.train,
        token_budget=train.token_budget,
        examples_per_step=train.batch_size * train.gradient_accumulation_steps * state.num_processes,
    )
    logger.info("Token budget %d -> %d optimizer steps (%s)", train.token_budget, plan["max_steps"], plan)
    checkpoint = last_checkpoint(run_dir) if resume else None
    if checkpoint is not None:
        check_checkpoint_schedule(checkpoint, plan["max_steps"])
        fsdp.check_resume(checkpoint, state.num_processes, fsdp.fsdp_requested())
    elif resume:
        logger.info("--resume: %s holds no checkpoint yet; training from step 0", run_dir)
    state.wait_for_everyone()  # every rank has checked and read its data before the main process writes
    if state.is_main_process:
        start_run_folder(run_dir, command, run.to_dict(), overwrite)
        if not (run_dir / "tokenizer_config.json").is_file():  # a resumed run keeps the tokenizer it started with
            tokenizer.save_pretrained(run_dir)
    state.wait_for_everyone()
    set_seed(train.seed)  # identical initial weights on every rank and in every resumption
    _, model_class = family_classes(run.model.family)
    model = model_class(build_model_config(run, tokenizer))
    attention = choose_attention(
        model.config,
        state.device,
        packed=run.data.packing == "pack",
        half_precision=use_bf16(train.precision),
        requested=train.attn_implementation,
    )
    model.set_attn_implementation(attention.implementation)
    if state.is_main_process:
        logger.info(attention.line())
    if fsdp.fsdp_requested():
        fsdp.reshape_scalar_parameters(model)  # before the optimizer sees the parameters
    drope = train.drope_fraction is not None and model.config.has_position_signal
    switch_step = drope_step(train.drope_fraction, plan["max_steps"]) if drope else None
    trainer = build_trainer(
        model, tokenizer, training_arguments(train, run.output_dir, plan["max_steps"], drope), data.train,
        data.eval_sets, mlm=run.mlm, optimizer_settings=run.optimizer, packed=run.data.packing == "pack",
        seq_len=lengths.seq_len, seed=train.seed, drope_step=switch_step, callbacks=callbacks,
    )  # fmt: skip
    fsdp.configure_trainer(trainer)
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    results = _final_results(trainer, data, plan, tokenizer, run.model.family, lengths)
    results["attention"] = {"implementation": attention.implementation, "reason": attention.reason}
    weights = fsdp.gathered_state_dict(trainer.model) if trainer.is_fsdp_enabled else None  # every rank gathers
    if trainer.is_world_process_zero():
        _save_run(
            run_dir, run.to_dict(), trainer, results, title=f"{run.model.family}: {run_dir.name}", weights=weights
        )
    trainer.accelerator.wait_for_everyone()
    return PretrainResult(run_dir=run_dir, results=results, trainer=trainer)


def _final_results(trainer, data: RunData, plan: dict, tokenizer, family: str, lengths: PretrainLengths) -> dict:
    """Validation and test metrics at both evaluation lengths, the unigram baseline, the copy-or-unigram floor on
    the test masks, the real token count and the run's lengths."""
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
        "family": family,
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
        "seq_len": lengths.seq_len,
        "long_len": lengths.long_seq_len,
        "lengths": lengths.record(),
    }


def _prefixed(sets: dict) -> dict:
    return {f"test_{name}": dataset for name, dataset in sets.items()}


def _metrics_by_length(metrics: dict, prefix: str) -> dict:
    """{"short": {...}, "long": {...}} from Trainer keys such as ``eval_short_accuracy``."""
    from .metrics import METRIC_NAMES

    return {
        length: {name: metrics[f"{prefix}_{length}_{name}"] for name in METRIC_NAMES} for length in ("short", "long")
    }


def _save_run(run_dir: Path, run_config: dict, trainer, results: dict, title: str, weights: dict | None = None):
    """`weights`: the gathered weights of an FSDP run (its Trainer saves sharded checkpoints only)."""
    from encoderlab.hub_cards.card import build_model_card

    if weights is None:
        trainer.save_model(str(run_dir))  # model, remote code, tokenizer
    else:
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(run_dir, state_dict=weights)
        trainer.processing_class.save_pretrained(run_dir)
    save_run_config(run_dir, run_config)
    write_results(run_dir, results)
    save_training_log(run_dir, trainer.state.log_history, title=title)
    build_model_card(read_run_record(run_dir)).save(run_dir / "README.md")
