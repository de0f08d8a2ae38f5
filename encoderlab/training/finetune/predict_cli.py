"""``encoderlab predict classify`` / ``predict tokens``: the command line of `encoderlab.training.finetune.predict`.
Inputs come from ``--text`` (and ``--text-pair``) or a JSONL file; each prediction is printed as one JSON line with
its input."""

import argparse
import json
import sys
from pathlib import Path

from ..text_files import read_text_file
from .model_path import check_local_model
from .predict import AUTO_CLASSES, COMMANDS, check_residues, classify, load_classifier, tag


def read_inputs(args: argparse.Namespace) -> tuple[list, list | None, list[str]]:
    """Texts (and pairs) from ``--text`` / ``--text-pair`` or a JSONL file of ``{"text": ..., "text_pair": ...}``,
    with how errors name each input (``--text 2``, ``FILE line 3``)."""
    if args.file is None:
        if not args.text:
            raise ValueError("give --text (repeatable) or --file FILE.jsonl")
        return args.text, args.text_pair or None, [f"--text {number}" for number in range(1, len(args.text) + 1)]
    if not Path(args.file).is_file():
        raise ValueError(f"--file={args.file!r} does not exist")
    numbered = [
        (number, line) for number, line in enumerate(read_text_file(args.file).splitlines(), start=1) if line.strip()
    ]
    rows = []
    for number, line in numbered:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"--file={args.file!r} line {number}: not JSON ({error.msg}); give one JSON object "
                'per line, {"text": ...}'
            ) from None
    missing = [
        number
        for (number, _), row in zip(numbered, rows, strict=True)
        if not isinstance(row, dict) or "text" not in row
    ]
    if missing:
        raise ValueError(f"--file={args.file!r}: line(s) {missing[:5]} have no 'text' field")
    pairs = [row["text_pair"] for row in rows] if rows and all("text_pair" in row for row in rows) else None
    return [row["text"] for row in rows], pairs, [f"{args.file} line {number}" for number, _ in numbered]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a fine-tuned run folder or Hub model id")
    parser.add_argument("--text", action="append", default=[], help="an input text (repeatable)")
    parser.add_argument("--text-pair", action="append", default=[], help="classify: the second text of a pair")
    parser.add_argument("--file", help='JSONL, one {"text": ..., "text_pair": ...} per line')
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (default 32)")
    parser.add_argument(
        "--unknown-residues",
        choices=("error", "allow"),
        default="error",
        help="protein models: a character outside the tokenizer's residue alphabet (J, *, a digit, "
        "a space) is an error naming the input (default), or with allow read as the unknown "
        "token and counted on stderr",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model code stored with a Hub model (for encoders not in transformers; "
        "encoderlab run folders load without it)",
    )


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the inputs, and a local model's folder and head (`run`
    meets each check again)."""
    read_inputs(args)
    task = "token" if args.command_1 == "tokens" else "classify"
    check_local_model(args.model, AUTO_CLASSES[task], COMMANDS[task])


def run(args: argparse.Namespace) -> int:
    task = "token" if args.command_1 == "tokens" else "classify"
    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size} must be >= 1")
    texts, pairs, names = read_inputs(args)
    if task == "token" and pairs:
        raise ValueError(
            "--text-pair (or text_pair in --file) is for `encoderlab predict classify`; a token "
            "classifier tags one text at a time"
        )
    model, tokenizer = load_classifier(args.model, task, args.trust_remote_code)
    counts = check_residues(
        tokenizer,
        list(zip(texts, pairs, strict=True)) if pairs else [(text,) for text in texts],
        names,
        args.unknown_residues,
        setting="--unknown-residues allow",
    )
    if counts is not None and (counts.unknown_characters or counts.lowercase_records):
        sys.stderr.write(
            f"{counts.unknown_characters} character(s) outside the residue alphabet in "
            f"{counts.unknown_records} of {counts.records} sequences read as the unknown token; "
            f"{counts.lowercase_records} sequence(s) with lowercase letters read as uppercase\n"
        )
    # checked above, where errors name the inputs as given
    outputs = (
        tag(model, tokenizer, texts, args.batch_size, unknown_residues="allow")
        if task == "token"
        else classify(model, tokenizer, texts, pairs, args.batch_size, unknown_residues="allow")
    )
    for number, (text, output) in enumerate(zip(texts, outputs, strict=True)):
        echo = {"text": text} | ({"text_pair": pairs[number]} if pairs else {})
        sys.stdout.write(json.dumps(echo | {"prediction": output}) + "\n")
    return 0
