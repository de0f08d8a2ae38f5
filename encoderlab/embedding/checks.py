"""The checks every record passes before anything is written: a sequence at all, an id not seen before, and, for a
residue tokenizer (ESM-2's, TAPE's), no gap and no character outside its alphabet.

Gaps: ESM-2's vocabulary has ``-`` and ``.``, but a protein with gaps is an alignment row, whose embedding depends on
where the aligner put them; embedding it is almost always a mistake. So gaps are refused by default, naming the
record, and ``--gaps remove`` embeds the sequence without them (per-token rows then follow the ungapped residues).
Other characters outside the alphabet (``*``, ``J``, digits) are refused by name, or with ``--unknown-residues allow``
become the unknown token and are counted (`encoderlab.tokenization.residues`).
"""

from ..tokenization.residues import ResidueChecker
from .choices import GAPS_CHOICES
from .inputs import Record

GAP_CHARACTERS = "-."


class RecordChecks:
    """Checks records in input order and counts what it lets through (`counts`, reported in the manifest)."""

    def __init__(self, tokenizer, unknown_residues: str = "error", gaps: str = "error"):
        if gaps not in GAPS_CHOICES:
            raise ValueError(f"--gaps={gaps!r} is not one of {list(GAPS_CHOICES)}")
        self.residues = ResidueChecker(tokenizer, unknown_residues, setting="--unknown-residues allow")
        self.gaps = gaps
        self.first_index_of: dict[str, int] = {}
        self.gapped_records = 0

    def check(self, record: Record) -> str:
        """The sequence to tokenize (`cleaned`), or a ValueError naming the record."""
        if not record.sequence.strip():
            raise ValueError(f"{record.label}: no sequence (an empty record); remove it or give it its sequence")
        first = self.first_index_of.setdefault(record.id, record.index)
        if first != record.index:
            raise ValueError(
                f"{record.label}: the id {record.id!r} is used by record {first + 1} already; ids must "
                "be unique, so each row of the output names one sequence"
            )
        if self.residues.active:
            gaps = sum(record.sequence.count(gap) for gap in GAP_CHARACTERS)
            if gaps and self.gaps == "error":
                raise ValueError(
                    f"{record.label}: {gaps} gap character(s) ('-' or '.'): it looks like a row of an "
                    "alignment, whose embedding depends on where the gaps were put; pass --gaps remove "
                    "to embed the sequence without them"
                )
            self.gapped_records += bool(gaps)
        sequence = self.cleaned(record.sequence)
        if not sequence:
            raise ValueError(f"{record.label}: only gap characters, no residue to embed")
        self.residues.check(sequence, record.label)
        return sequence

    def cleaned(self, sequence: str) -> str:
        """`sequence` as it is tokenized: without gaps when ``--gaps remove`` applies (residue tokenizers only)."""
        if self.residues.active and self.gaps == "remove":
            for gap in GAP_CHARACTERS:
                sequence = sequence.replace(gap, "")
        return sequence

    def counts(self) -> dict[str, int]:
        found = {key: value for key, value in self.residues.counts.as_dict().items() if key != "records"}
        return {**found, "gapped_records": self.gapped_records} if self.residues.active else {}


__all__ = ["RecordChecks"]
