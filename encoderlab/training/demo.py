"""``encoderlab demo`` (``make demo``): the whole pipeline on a laptop CPU in a few minutes.

Pretrains a small DTA-BERT (dual triangle attention, no position encoding) on the embedded corpus with the
bundled ``demo`` run config, evaluates it at 1x and 4x the training length, saves checkpoint + tokenizer + model
card + plot to ``runs/demo``, reloads the saved folder through ``AutoModelForMaskedLM`` and shows a fill-mask
example and the results table, with the unigram baseline and the copy-or-unigram floor next to the model.

By default the run is short (`QUICK_BUDGET` tokens: a first result in about two minutes on two cores); ``--full``
trains on the config's whole budget, for a better model. The demo starts from scratch each time: it replaces an
earlier demo run (recognised by the run marker `run_folder.MARKER_FILE` naming ``demo``) once the new run has
passed its checks, replaces another encoderlab run only with ``--overwrite``, and refuses any other folder that is
not empty.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

from .pretrain import INTERRUPTED_EXIT_CODE, format_results, load_run_config, pretrain
from .run_folder import run_owner


logger = logging.getLogger(__name__)


EXAMPLE = "The return statement leaves the current function call with the expression list as return {mask}."
QUICK_BUDGET = 1_000_000
"""Tokens of the default (quick) demo; ``--full`` trains on the bundled config's budget."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", default="runs/demo", help="run folder: new, empty, or an earlier demo run (which is replaced)"
    )
    parser.add_argument(
        "--full", action="store_true",
        help=f"train on the demo config's whole token budget, {full_budget():,} tokens (a better model, in more "
        f"time), instead of the quick default of {QUICK_BUDGET:,}",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true",
                        help="also replace an encoderlab run other than an earlier demo in --output-dir")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a key of the demo config, e.g. --set train.token_budget=2e6",
    )  # fmt: skip


def full_budget() -> int:
    return load_run_config("demo").train.token_budget


def fill_mask_example(run_dir: Path, text: str = EXAMPLE) -> list[dict]:
    """Reload the saved run the way a user would and complete `text` (its ``{mask}`` marks the gap)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    return fill(text.format(mask=tokenizer.mask_token), top_k=5)


def demo_overrides(args: argparse.Namespace) -> list[str]:
    """The demo config's overrides: the quick budget unless --full, then the user's own and the folder."""
    quick = [] if args.full else [f"train.token_budget={QUICK_BUDGET}"]
    return [*quick, *args.overrides, f"output_dir={args.output_dir}"]


def run(args: argparse.Namespace) -> int:
    config = load_run_config("demo", demo_overrides(args))
    run_dir = Path(config.output_dir)
    start = time.perf_counter()
    try:
        # An earlier demo run is replaced, but only once the new run has passed its checks and read its data.
        result = pretrain(config, command="demo", overwrite=args.overwrite or run_owner(run_dir) == "demo")
    except KeyboardInterrupt:
        print("\nInterrupted: a demo is not resumed; it starts from scratch when run again", file=sys.stderr)
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
    print(f"\nModel accuracy minus the copy-or-unigram floor (copy unmasked inputs, else the most frequent token) "
          f"at {results['seq_len']} tokens: {margin:+.3f}")
    if not args.full:
        print(f"\nThis was the quick demo ({QUICK_BUDGET:,} tokens); `encoderlab demo --full` trains on "
              f"{full_budget():,} for a better model (see the README for how long each takes).")
    return 0
