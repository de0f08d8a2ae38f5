"""``encoderlab predict qa``: the command line of `encoderlab.training.finetune.predict_qa`. Questions come from
``--question`` and ``--context`` or a JSON / JSONL / SQuAD file; the answers are printed, or written with
``--output``, as JSON lines::

    encoderlab predict qa --model runs/squad_v2 --question "Who ruled Normandy?" --context "In 1066 ..."
    encoderlab predict qa --model runs/squad_v2 --input questions.jsonl --output answers.jsonl
"""

import argparse
import json
import sys
from pathlib import Path

from ..text_files import read_text_file
from .model_path import check_local_model
from .predict_qa import DEFAULT_DOC_STRIDE, answer_questions, load_model
from .squad import read_squad_json


def read_questions(path: str) -> list[dict]:
    """``{question, context[, id]}`` records of a JSONL file, a JSON list, or an official SQuAD JSON file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(
            f"--input={path!r} does not exist; expected a JSON or JSONL file of "
            '{"question": ..., "context": ...} records (or an official SQuAD file)'
        )
    text = read_text_file(file)  # not UTF-8: named with the byte offset
    try:
        records = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if file.suffix == ".jsonl"
            else json.loads(text)
        )
    except json.JSONDecodeError as error:
        raise ValueError(f"--input={path!r} is not valid {file.suffix[1:] or 'JSON'}: {error}") from None
    if isinstance(records, dict) and "data" in records:
        records = read_squad_json(file)
    if not isinstance(records, list) or not records:
        raise ValueError(f"--input={path!r} must hold a non-empty list of question records")
    for number, record in enumerate(records):
        if not isinstance(record, dict) or not {"question", "context"} <= record.keys():
            raise ValueError(
                f"--input={path!r}: record {number} must be an object with 'question' and 'context' "
                f"keys, got {str(record)[:100]!r}"
            )
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="fine-tuned QA model folder (a run folder) or Hub id")
    parser.add_argument("--question", help="one question (with --context)")
    parser.add_argument("--context", help="the text that holds the answer")
    parser.add_argument("--input", help="JSON / JSONL file of {question, context[, id]} records, or a SQuAD file")
    parser.add_argument("--output", help="write the answers as JSONL here instead of printing them")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="window length in tokens (default: the tokenizer's model_max_length, else 384)",
    )
    parser.add_argument(
        "--doc-stride",
        type=int,
        default=None,
        help=f"tokens shared by neighbouring windows (default {DEFAULT_DOC_STRIDE}, or half the window "
        "when that is shorter)",
    )
    parser.add_argument("--max-answer-length", type=int, default=30, help="longest answer in tokens")
    parser.add_argument("--n-best", type=int, default=20, help="candidate spans per question")
    parser.add_argument(
        "--null-threshold",
        type=float,
        default=None,
        help="answer '' when null score - best span score > this (default: the model's own, v2)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="windows per forward pass (default 32)")


def question_records(args: argparse.Namespace) -> list[dict]:
    """The records of ``--input``, or the one of ``--question`` and ``--context``."""
    if args.input and (args.question or args.context):
        raise ValueError("give either --input FILE or --question and --context, not both")
    if not args.input and not (args.question and args.context):
        raise ValueError("give --question and --context (both), or --input FILE")
    return read_questions(args.input) if args.input else [{"question": args.question, "context": args.context}]


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the inputs, and a local model's folder and head (`run`
    meets each check again)."""
    question_records(args)
    check_local_model(args.model, "AutoModelForQuestionAnswering", "encoderlab predict qa")


def run(args: argparse.Namespace) -> int:
    records = question_records(args)
    model, tokenizer = load_model(args.model)
    answers = answer_questions(
        model,
        tokenizer,
        [r["question"] for r in records],
        [r["context"] for r in records],
        max_length=args.max_length,
        doc_stride=args.doc_stride,
        max_answer_length=args.max_answer_length,
        n_best=args.n_best,
        null_threshold=args.null_threshold,
        batch_size=args.batch_size,
    )
    lines = [
        json.dumps(
            ({"id": record["id"]} if "id" in record else {}) | {"question": record["question"]} | answer,
            ensure_ascii=False,
        )
        for record, answer in zip(records, answers, strict=True)
    ]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0
