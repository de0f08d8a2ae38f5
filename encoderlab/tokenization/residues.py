"""Checks of protein sequences against a residue tokenizer's alphabet, before anything is tokenized.

A residue tokenizer (ESM-2's, TAPE's) maps every character it does not know to ``<unk>`` without a word, and
upper-cases lowercase letters. A user's own data meets both: a stop codon written as ``*``, a ``J``, a digit or a
space inside a sequence, or a soft-masked (lowercase) region. These functions find them so that fine-tuning,
prediction and embedding can refuse such a record by name, or count what they let through.
"""

from collections.abc import Iterable
from dataclasses import dataclass

UNKNOWN_RESIDUES_CHOICES = ("error", "allow")
"""What to do with characters outside a residue tokenizer's alphabet: refuse the record, or map them to <unk>."""


def residue_alphabet(tokenizer) -> frozenset[str] | None:
    """The characters a residue-level tokenizer has a token for (upper case), or None when `tokenizer` is not
    residue-level (a text tokenizer, whose sub-word vocabulary covers any text one way or another)."""
    specials = set(tokenizer.all_special_tokens)
    pieces = [piece for piece in tokenizer.get_vocab() if piece not in specials]
    if not pieces or any(len(piece) != 1 for piece in pieces):
        return None
    return frozenset(pieces)


def unknown_characters(
    sequence: str, alphabet: frozenset[str], special_tokens: Iterable[str] = ()
) -> list[tuple[int, str]]:
    """(offset, character) of every character of `sequence` that is not in `alphabet` once upper-cased.
    Special-token strings written in the sequence (``<mask>``) are tokens, not unknown characters."""
    for token in special_tokens:
        # Same length, so the offsets of the other characters stay those of the user's text.
        sequence = sequence.replace(token, min(alphabet) * len(token))
    return [(offset, char) for offset, char in enumerate(sequence) if char.upper() not in alphabet]


def describe_unknown(found: list[tuple[int, str]], shown: int = 5) -> str:
    """``'J' at 4, '*' at 120 (and 3 more)``: 0-based character offsets."""
    listed = ", ".join(f"{char!r} at {offset}" for offset, char in found[:shown])
    return listed + (f" (and {len(found) - shown} more)" if len(found) > shown else "")


@dataclass
class ResidueCounts:
    """What a residue check saw in a set of records: reported in logs and results files."""

    records: int = 0
    lowercase_records: int = 0  # records with lowercase letters, which the tokenizer upper-cases
    unknown_characters: int = 0  # characters mapped to <unk> (only non-zero when they are allowed)
    unknown_records: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class ResidueChecker:
    """Checks records one at a time against a residue tokenizer's alphabet and counts what it sees.

    Args:
        tokenizer: The tokenizer the records will meet; a non-residue tokenizer makes every check a no-op.
        policy: ``"error"`` refuses a record with characters outside the alphabet, ``"allow"`` counts them.
        setting: How the user allows unknown characters, named in the error (``data.unknown_residues=allow``).
    """

    def __init__(self, tokenizer, policy: str = "error", setting: str = "data.unknown_residues=allow"):
        if policy not in UNKNOWN_RESIDUES_CHOICES:
            raise ValueError(f"unknown_residues={policy!r} is not one of {list(UNKNOWN_RESIDUES_CHOICES)}.")
        self.alphabet = residue_alphabet(tokenizer)
        self.special_tokens = tuple(tokenizer.all_special_tokens)
        self.policy = policy
        self.setting = setting
        self.counts = ResidueCounts()

    @property
    def active(self) -> bool:
        return self.alphabet is not None

    def check(self, sequence: str, record: str) -> None:
        """Counts `sequence` and raises a ValueError naming `record` (e.g. ``record 'P1' (line 3 of x.fasta)``)
        when it has unknown characters and the policy is ``"error"``."""
        if self.alphabet is None:
            return
        self.counts.records += 1
        self.counts.lowercase_records += any(char.islower() for char in sequence)
        found = unknown_characters(sequence, self.alphabet, self.special_tokens)
        if not found:
            return
        if self.policy == "error":
            raise ValueError(
                f"{record}: {len(found)} character(s) outside the tokenizer's residue alphabet: "
                f"{describe_unknown(found)}; the alphabet is {''.join(sorted(self.alphabet))} (lowercase is read as "
                f"uppercase); set {self.setting} to map them to the unknown token instead."
            )
        self.counts.unknown_characters += len(found)
        self.counts.unknown_records += 1
