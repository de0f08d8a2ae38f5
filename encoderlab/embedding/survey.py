"""The first pass over the input: every record checked and tokenized before anything is written, the counts the
manifest reports, the shards the run will write, and a fingerprint of the input that ``--resume`` compares.

Shards are cut in input order: a shard closes once its records hold `shard_tokens` tokens, so the plan depends on the
input and the options only, and a resumed run cuts the same shards as the run it completes.
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .checks import RecordChecks
from .inputs import InputSource, Record
from .pieces import LengthPolicy, content_ids

TOKENIZE_BLOCK = 256
"""Records tokenized at once (fast tokenizers work on a batch in parallel)."""


@dataclass
class Shard:
    """Records ``[start, end)`` of the input, holding `tokens` content tokens to embed."""

    start: int
    end: int
    tokens: int


@dataclass
class Survey:
    records: int = 0
    tokens: int = 0  # content tokens embedded (after truncation), the special tokens left out
    truncated: int = 0
    windowed: int = 0
    unknown_tokens: int = 0
    shards: list[Shard] = field(default_factory=list)
    fingerprint: str = ""
    residues: dict = field(default_factory=dict)

    def counts(self) -> dict:
        return {
            "records": self.records,
            "tokens": self.tokens,
            "truncated": self.truncated,
            "windowed": self.windowed,
            "unknown_tokens": self.unknown_tokens,
        }


def tokenized_blocks(records, checks: RecordChecks, tokenizer, check: bool) -> Iterator[tuple[Record, list[int]]]:
    """(record, content token ids) in input order; `check` runs every check of `checks` (the first pass), else only
    the cleaning they define (the records were checked already)."""
    block = []
    for record in records:
        block.append((record, checks.check(record) if check else checks.cleaned(record.sequence)))
        if len(block) == TOKENIZE_BLOCK:
            yield from zip(
                (record for record, _ in block), content_ids(tokenizer, [text for _, text in block]), strict=True
            )
            block = []
    if block:
        yield from zip(
            (record for record, _ in block), content_ids(tokenizer, [text for _, text in block]), strict=True
        )


def survey(source: InputSource, tokenizer, checks: RecordChecks, policy: LengthPolicy, shard_tokens: int) -> Survey:
    found = Survey()
    digest = hashlib.sha256()
    shard_start, shard_held = 0, 0
    unknown_id = tokenizer.unk_token_id
    for record, ids in tokenized_blocks(source.records(), checks, tokenizer, check=True):
        policy.check(len(ids), record.label)
        embedded = policy.embedded_tokens(len(ids))
        found.records += 1
        found.tokens += embedded
        found.truncated += embedded < len(ids)
        found.windowed += embedded > policy.width
        if unknown_id is not None:
            found.unknown_tokens += int(np.count_nonzero(np.asarray(ids[:embedded]) == unknown_id))
        digest.update(f"{record.id}\t{checks.cleaned(record.sequence)}\n".encode())
        shard_held += embedded
        if shard_held >= shard_tokens:
            found.shards.append(Shard(shard_start, found.records, shard_held))
            shard_start, shard_held = found.records, 0
    if shard_held:
        found.shards.append(Shard(shard_start, found.records, shard_held))
    if found.records == 0:
        raise ValueError(f"{source.name} holds no record to embed (an empty input)")
    found.fingerprint = f"sha256:{digest.hexdigest()}"
    found.residues = checks.counts()
    return found


__all__ = ["Shard", "Survey", "survey", "tokenized_blocks"]
