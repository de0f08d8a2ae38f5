"""How far simple context rules get on masked residues: the yardstick for the protein MLM table
(docs/experiments-dta.md).

Four predictors of a masked residue in 64-residue windows with 15% masking, none of them a neural network:
the most frequent training residue (unigram), the most frequent residue among the visible ones of the window
(composition), the most frequent residue after its left neighbour (bigram), and given both neighbours (trigram).
Counts come from a random 90% of the proteins, scores from the other 10% (a split of its own, not the experiment's).
If none of them beats the unigram, a small MLM has no cheap contextual signal to pick up early in training.

Usage: python bench/protein_context_baselines.py [--fasta ../shared/data/proteins/uniprot_sample_20k.fasta.gz]
"""

import argparse
import gzip
import random
from collections import Counter, defaultdict
from pathlib import Path

FASTA = Path(__file__).resolve().parents[2] / "shared" / "data" / "proteins" / "uniprot_sample_20k.fasta.gz"
WINDOW, MASK_PROBABILITY = 64, 0.15


def read_fasta(path: Path) -> list[str]:
    sequences, current = [], []
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as handle:
        for line in handle:
            if line.startswith(">"):
                if current:
                    sequences.append("".join(current))
                current = []
            else:
                current.append(line.strip())
    if current:
        sequences.append("".join(current))
    return sequences


def most_common(counter: Counter | None) -> str | None:
    return counter.most_common(1)[0][0] if counter else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=FASTA)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    proteins = read_fasta(args.fasta)
    rng.shuffle(proteins)
    cut = int(0.9 * len(proteins))
    train, test = proteins[:cut], proteins[cut:]

    unigram = most_common(Counter("".join(train)))
    after, between = defaultdict(Counter), defaultdict(Counter)
    for protein in train:
        for i in range(1, len(protein) - 1):
            after[protein[i - 1]][protein[i]] += 1
            between[protein[i - 1], protein[i + 1]][protein[i]] += 1

    hits, scored = Counter(), 0
    for protein in test:
        for start in range(0, len(protein) - WINDOW + 1, WINDOW):
            window = protein[start : start + WINDOW]
            masked = {i for i in range(1, WINDOW - 1) if rng.random() < MASK_PROBABILITY}
            composition = most_common(Counter(window[i] for i in range(WINDOW) if i not in masked))
            for i in masked:
                scored += 1
                guesses = {
                    "unigram": unigram,
                    "window composition": composition,
                    "left neighbour (bigram)": most_common(after.get(window[i - 1])),
                    "both neighbours (trigram)": most_common(between.get((window[i - 1], window[i + 1]))),
                }
                hits.update(name for name, guess in guesses.items() if guess == window[i])
    print(f"{len(train)} training proteins, {len(test)} scored; {scored} masked residues")
    for name in ("unigram", "window composition", "left neighbour (bigram)", "both neighbours (trigram)"):
        print(f"{name:26s} accuracy {hits[name] / scored:.3f}")


if __name__ == "__main__":
    main()
