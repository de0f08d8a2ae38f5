"""``encoderlab embed MODEL INPUT --output FOLDER``: the command's options; the run is `encoderlab.embedding.run`.

This module imports nothing heavy, so ``encoderlab embed --help`` answers at once.
"""

import argparse
import logging

from .choices import (
    ATTENTION_KERNELS,
    DEVICES,
    GAPS_CHOICES,
    INPUT_KINDS,
    LONG_CHOICES,
    POOLINGS,
    PRECISIONS,
    STORAGE_DTYPES,
    UNKNOWN_RESIDUES_CHOICES,
)
from .option_checks import check_without_model

# Imported inside functions (cost): the run and the reading of its shards (torch, pyarrow), so that --help and check()
# answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)

INTERRUPTED = 130
"""The exit status of a run stopped with Ctrl-C (128 + SIGINT), as a shell reports it."""


def layer_word(value: str):
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a layer number (0 = embeddings, -1 = last) nor 'all'"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Embed every sequence of a FASTA, CSV/TSV/JSON lines or text file, or of a Hub dataset, "
        "into a folder of Parquet shards: pooled vectors per sequence, optionally one row per "
        "token (docs/embeddings.md)."
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a checkpoint folder (a run folder, a fine-tuned run) or a Hub model id, of any encoderlab family",
    )
    parser.add_argument(
        "input",
        metavar="INPUT",
        help="a FASTA (.fasta/.fa/.faa, optionally .gz), .csv, .tsv, "
        ".jsonl or .txt file (one sequence a line), or a Hub dataset id (streamed)",
    )
    parser.add_argument("--output", "-o", required=True, metavar="FOLDER", help="the folder to write")
    source = parser.add_argument_group("input")
    source.add_argument(
        "--input-format",
        choices=INPUT_KINDS,
        help="the kind of INPUT (default: by its suffix; a name that is no local file is a Hub dataset)",
    )
    source.add_argument(
        "--column",
        help="tables and Hub datasets: the sequence column (default: the one named "
        "sequence, seq, text, sentence, ... or the only column)",
    )
    source.add_argument(
        "--id-column",
        help="tables and Hub datasets: the id column (default: the one named id, "
        "name, accession, ...; none: row numbers)",
    )
    source.add_argument("--split", default="train", help="Hub datasets: the split (default: %(default)s)")
    source.add_argument("--subset", help="Hub datasets: the subset (configuration) name")
    source.add_argument(
        "--unknown-residues",
        choices=UNKNOWN_RESIDUES_CHOICES,
        default="error",
        help="protein "
        "tokenizers: refuse a sequence with characters outside the alphabet, or map them to the "
        "unknown token and count them (default: %(default)s)",
    )
    source.add_argument(
        "--gaps",
        choices=GAPS_CHOICES,
        default="error",
        help="protein tokenizers: refuse "
        "alignment gaps ('-', '.'), or remove them before embedding (default: %(default)s)",
    )
    what = parser.add_argument_group("what is written")
    what.add_argument(
        "--pooling",
        nargs="+",
        choices=POOLINGS,
        default=["mean"],
        help="per-sequence vectors: mean "
        "over the real tokens without special tokens, the cls token's, the maximum (default: mean)",
    )
    what.add_argument(
        "--per-token",
        action="store_true",
        help="also write one row per token (a protein of n residues gives n rows), in their own shards",
    )
    what.add_argument(
        "--layers",
        nargs="+",
        type=layer_word,
        default=[-1],
        help="layer numbers (0 = embeddings, "
        "-1 = last, after the final norm; -4 = three below it), or all (default: -1)",
    )
    what.add_argument(
        "--dtype",
        choices=STORAGE_DTYPES,
        default="float32",
        help="storage dtype; bfloat16 is stored as uint16 bit patterns (default: %(default)s)",
    )
    what.add_argument("--normalize", action="store_true", help="scale every pooled vector to unit L2 norm")
    run = parser.add_argument_group("how it runs")
    run.add_argument(
        "--max-tokens", type=int, help="positions per batch, padding included (default: 8192 on CPU, 65536 on a GPU)"
    )
    run.add_argument(
        "--no-pack",
        dest="pack",
        action="store_false",
        help="length-sorted padded batches instead of packed rows (for comparison)",
    )
    run.add_argument(
        "--long",
        choices=LONG_CHOICES,
        default="error",
        help="sequences longer than --max-length: "
        "refuse them, keep their first tokens, or embed them in overlapping windows (default: "
        "%(default)s)",
    )
    run.add_argument(
        "--overlap",
        type=int,
        default=128,
        help="tokens shared by neighbouring windows (--long windows; default: %(default)s)",
    )
    run.add_argument(
        "--max-length",
        type=int,
        help="tokens the model takes at once, special tokens included "
        "(default and maximum: the model's max_position_embeddings)",
    )
    run.add_argument("--device", choices=DEVICES, default="auto", help="default: a GPU if there is one")
    run.add_argument(
        "--precision", choices=PRECISIONS, default="auto", help="auto: bf16 autocast on a GPU, fp32 on CPU"
    )
    run.add_argument(
        "--attention",
        choices=ATTENTION_KERNELS,
        help="the attention kernel (default: varlen for packed rows on a GPU where the model allows it, else sdpa)",
    )
    run.add_argument(
        "--shard-tokens",
        type=int,
        help="tokens per output shard (default: 2**20; with --per-token, about 256 MiB of vectors)",
    )
    run.add_argument("--resume", action="store_true", help="complete a stopped output in --output")
    run.add_argument("--overwrite", action="store_true", help="replace the encoderlab output or run in --output")


def keywords(args: argparse.Namespace) -> dict:
    """The options of the command line as `embed`'s keyword arguments."""
    return {
        key: value
        for key, value in vars(args).items()
        if key not in ("model", "input", "output", "module", "debug") and not key.startswith("command_")
    }


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: every option mistake seen without the model (`embed`
    meets each check again)."""
    check_without_model(args.model, args.input, args.output, **keywords(args))


def run(args: argparse.Namespace) -> int:
    from .run import embed

    try:
        manifest = embed(args.model, args.input, args.output, **keywords(args))
    except KeyboardInterrupt:
        logger.warning(stopped_line(args.output))
        return INTERRUPTED
    counts = manifest["counts"]
    logger.info("%d sequences embedded into %s (%d tokens)", counts["records"], args.output, counts["tokens"])
    return 0


def stopped_line(output: str) -> str:
    """What a Ctrl-C left in `output`, and how to go on."""
    from .storage import read_manifest

    try:
        written = read_manifest(output)["counts"]["written"]
    except FileNotFoundError:
        return "stopped before anything was written"
    return (
        f"stopped: {written} sequences are written, in whole shards; the same command with --resume completes {output}"
    )
