"""``encoderlab demo`` (``make demo``): the whole pipeline on a laptop CPU in a few minutes.

Pretrains a small DTA-BERT (dual triangle attention, no position encoding) on the embedded corpus with the
bundled ``demo`` run config, evaluates it at 1x and 4x the training length, saves checkpoint + tokenizer + model
card + plot to ``runs/demo``, reloads the saved folder through ``AutoModelForMaskedLM`` and shows a fill-mask
example and the results table, with the unigram baseline and the copy-or-unigram floor next to the model.

The demo starts from scratch each time: it replaces the folder of an earlier demo run (recognised by the run
marker `run_folder.MARKER_FILE` naming ``demo``) and refuses any other folder that is not empty.
"""

import argparse
import logging
import shutil
import time
from pathlib import Path

from .pretrain import format_results, load_run_config, pretrain, validate_run
from .run_folder import MARKER_FILE, run_owner


logger = logging.getLogger(__name__)


EXAMPLE = "The return statement leaves the current function call with the expression list as return {mask}."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", default="runs/demo", help="run folder: new, empty, or an earlier demo run (which is replaced)"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a key of the demo config, e.g. --set train.token_budget=1e6",
    )  # fmt: skip


def fill_mask_example(run_dir: Path, text: str = EXAMPLE) -> list[dict]:
    """Reload the saved run the way a user would and complete `text` (its ``{mask}`` marks the gap)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    return fill(text.format(mask=tokenizer.mask_token), top_k=5)


def clear_earlier_demo(run_dir: Path) -> None:
    """Remove `run_dir` if it holds an earlier demo run; refuse any other folder that is not empty."""
    if not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())):
        return
    if run_owner(run_dir) != "demo":
        raise ValueError(
            f"--output-dir {str(run_dir)!r} is not empty and is not an earlier demo run (no {MARKER_FILE} naming "
            "demo): nothing in it is touched; choose a new or empty folder"
        )
    logger.info("Replacing the earlier demo run in %s", run_dir)
    shutil.rmtree(run_dir)


def run(args: argparse.Namespace) -> int:
    config = load_run_config("demo", [*args.overrides, f"output_dir={args.output_dir}"])
    run_dir = Path(config.output_dir)
    validate_run(config)  # a bad --set must not cost the earlier demo run
    clear_earlier_demo(run_dir)
    start = time.perf_counter()
    result = pretrain(config, command="demo")
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
    return 0
