"""``encoderlab demo`` (``make demo``): the whole pipeline on a laptop CPU in a few minutes.

Pretrains a small DTA-BERT (dual triangle attention, no position encoding) on the embedded corpus with the
bundled ``demo`` run config, evaluates it at 1x and 4x the training length, saves checkpoint + tokenizer + model
card + plot to ``runs/demo``, reloads the saved folder through ``AutoModelForMaskedLM`` and shows a fill-mask
example and the results table, with the unigram baseline and the copy-or-unigram floor next to the model.

A first result comes early: at each checkpoint during training (one per evaluation, the first at a quarter of the
run) the demo prints the model's masked accuracy so far and its fill-mask answer (`StageReport`); Ctrl-C after any
of them keeps that checkpoint, which loads like the finished model. The demo starts from scratch each time: it
replaces an earlier demo run (recognised by the run marker `run_files.MARKER_FILE` naming ``demo``) once the new
run has passed its checks, replaces another encoderlab run only with ``--overwrite``, and refuses any other folder
that is not empty.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

from .pretrain import pretrain
from .pretrain_command import INTERRUPTED_EXIT_CODE, check_without_torch, format_results
from .run_config import PretrainRunConfig, load_run_config
from .run_folder import check_run_folder, last_checkpoint, run_owner

# Imported inside functions (cost): transformers, so that --help and check() answer without it (encoderlab/cli.py).

logger = logging.getLogger(__name__)

EXAMPLE = "The return statement leaves the current function call with the expression list as return {mask}."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", default="runs/demo", help="run folder: new, empty, or an earlier demo run (which is replaced)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="also replace an encoderlab run other than an earlier demo in --output-dir",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a key of the demo config, e.g. --set train.token_budget=2e6",
    )  # fmt: skip


def fill_mask_example(run_dir: Path, text: str = EXAMPLE) -> list[dict]:
    """Reload the saved run the way a user would and complete `text` (its ``{mask}`` marks the gap)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return fill_mask(AutoModelForMaskedLM.from_pretrained(run_dir), AutoTokenizer.from_pretrained(run_dir), text)


def fill_mask(model, tokenizer, text: str = EXAMPLE) -> list[dict]:
    """The five best completions of `text` (its ``{mask}`` marks the gap) by the fill-mask pipeline."""
    from transformers import pipeline

    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    return fill(text.format(mask=tokenizer.mask_token), top_k=5)


def stage_report_callback():
    """A Trainer callback (`StageReport`), built here so that the demo's ``--help`` imports no transformers."""
    from transformers import TrainerCallback

    class StageReport(TrainerCallback):
        """At each checkpoint before the end (one per evaluation): how far the run is, its masked accuracy on the
        validation windows and the fill-mask answer of the model as it stands, so the first result shows long
        before the end; printed once the checkpoint is saved, so a Ctrl-C after it keeps it."""

        def __init__(self):
            self.start, self.accuracy, self.first = time.perf_counter(), None, True

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            self.accuracy = (metrics or {}).get("eval_short_accuracy", self.accuracy)

        def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step >= state.max_steps or self.accuracy is None:
                return
            was_training = model.training
            best = fill_mask(model.eval(), processing_class)[0]
            model.train(was_training)
            minutes = (time.perf_counter() - self.start) / 60
            print(
                f"\n[{100 * state.global_step / state.max_steps:.0f}% after {minutes:.1f} min] step "
                f"{state.global_step} of {state.max_steps}: masked accuracy {self.accuracy:.3f} on the validation "
                f"windows; fill-mask: {best['sequence']!r} (p={best['score']:.2f})",
                flush=True,
            )
            if self.first:
                print("The demo trains on to the end; Ctrl-C stops it and keeps this step's checkpoint.", flush=True)
                self.first = False

    return StageReport()


def demo_config(args: argparse.Namespace) -> PretrainRunConfig:
    """The bundled ``demo`` run config with ``--set`` and ``--output-dir``."""
    return load_run_config("demo", [*args.overrides, f"output_dir={args.output_dir}"])


def replaces_run(args: argparse.Namespace, run_dir: Path) -> bool:
    """Whether the demo may replace the run in `run_dir`: an earlier demo, or any encoderlab run with --overwrite."""
    return args.overwrite or run_owner(run_dir) == "demo"


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the ``--set`` overrides and the output folder."""
    config = demo_config(args)
    check_without_torch(config)
    run_dir = Path(config.output_dir)
    check_run_folder(run_dir, "demo", False, config.to_dict(), replaces_run(args, run_dir))


def run(args: argparse.Namespace) -> int:
    config = demo_config(args)
    run_dir = Path(config.output_dir)
    start = time.perf_counter()
    try:
        # An earlier demo run is replaced, but only once the new run has passed its checks and read its data.
        result = pretrain(
            config, command="demo", overwrite=replaces_run(args, run_dir), callbacks=[stage_report_callback()]
        )
    except KeyboardInterrupt:
        print(f"\n{interrupted_demo(run_dir)}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    minutes = (time.perf_counter() - start) / 60
    predictions = fill_mask_example(run_dir)
    results = result.results
    print(f"\nPretraining took {minutes:.1f} min; saved to {run_dir} (model, tokenizer, README.md, plot, metrics).")
    print(f"\nfill-mask (reloaded with AutoModelForMaskedLM): {predictions[0]['sequence']!r}")
    for prediction in predictions:
        print(f"  {prediction['token_str']!r:>16}  p={prediction['score']:.3f}")
    print("\n" + format_results(results))
    margin = results["test"]["short"]["accuracy"] - results["copy_or_unigram_floor"]["short"]
    print(
        f"\nModel accuracy minus the copy-or-unigram floor (copy unmasked inputs, else the most frequent token) "
        f"at {results['seq_len']} tokens: {margin:+.3f}"
    )
    return 0


def interrupted_demo(run_dir: Path) -> str:
    """The one line Ctrl-C prints: the checkpoint the demo keeps, if any (a demo is not resumed)."""
    checkpoint = last_checkpoint(run_dir) if run_owner(run_dir) == "demo" else None
    if checkpoint is None:
        return "Interrupted before the first checkpoint; the demo starts from scratch when run again"
    return (
        f"Interrupted: {checkpoint} keeps the model as it was there; load it with "
        f"AutoModelForMaskedLM.from_pretrained({str(checkpoint)!r}). The demo starts from scratch when run again"
    )
