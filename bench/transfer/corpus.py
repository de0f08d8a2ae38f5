"""The in-domain pretraining corpus of the transfer experiment: the sentences of the GLUE training splits
of the five tasks it fine-tunes on, labels dropped (dev splits never read), and WikiText-2's test articles.

    python bench/transfer/corpus.py --data ../shared/data --out runs/transfer/corpus

writes ``glue_train.txt`` (documents of 40 consecutive sentences of one task, separated by blank lines, as
`encoderlab pretrain` reads a .txt) and ``wikitext2.txt`` (a copy: WikiText files are split into articles) and
prints what it wrote. ``data.source`` of the pretraining run is the folder.
"""

import argparse
import csv
import shutil
import sys
from pathlib import Path

SENTENCES_PER_DOCUMENT = 40
# task folder -> (has a header row, the columns holding text); CoLA's file has no header, its sentence is column 3.
GLUE_TEXT = {
    "CoLA": (False, [3]),
    "SST-2": (True, ["sentence"]),
    "MRPC": (True, ["#1 String", "#2 String"]),
    "STS-B": (True, ["sentence1", "sentence2"]),
    "RTE": (True, ["sentence1", "sentence2"]),
}


def task_sentences(path: Path, has_header: bool, columns: list) -> list:
    """Every text cell of a GLUE training file, in file order (pairs: the first sentence, then the second)."""
    csv.field_size_limit(sys.maxsize)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows) if has_header else None
        indices = [header.index(c) for c in columns] if has_header else columns
        return [row[i].strip() for row in rows for i in indices if len(row) > max(indices) and row[i].strip()]


def write_glue(data: Path, out: Path) -> dict:
    counts, documents = {}, []
    for task, (has_header, columns) in GLUE_TEXT.items():
        sentences = task_sentences(data / "glue" / task / "train.tsv", has_header, columns)
        counts[task] = len(sentences)
        for start in range(0, len(sentences), SENTENCES_PER_DOCUMENT):
            documents.append("\n".join(sentences[start : start + SENTENCES_PER_DOCUMENT]))
    (out / "glue_train.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return counts


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--data", type=Path, default=Path("../shared/data"))
    arguments.add_argument("--out", type=Path, default=Path("runs/transfer/corpus"))
    args = arguments.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    counts = write_glue(args.data, args.out)
    shutil.copyfile(args.data / "text" / "wikitext2_test.txt", args.out / "wikitext2.txt")
    words = sum(len(p.read_text(encoding="utf-8").split()) for p in args.out.glob("*.txt"))
    print(f"{args.out}: GLUE training sentences {counts} + WikiText-2 test articles; {words:,} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
