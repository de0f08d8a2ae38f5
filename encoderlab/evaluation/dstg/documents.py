"""Probe documents of the DSTG analyses: texts cut into model-length token windows with the structural targets
of the paper's Section 5 for every token.

A *segment* ends at terminal punctuation (``.``, ``!``, ``?`` followed by whitespace or the end of the text, so
``3.5`` and WikiText's ``1 @.@ 5`` do not end one) or at a newline; the next token starts a new segment. Texts
are concatenated (each text ends a segment) and cut into consecutive windows of ``length - 2`` tokens, each
wrapped in the tokenizer's ``[CLS] ... [SEP]``. Within a window, for every content token at index i (1-based,
after [CLS]):

- ``position``: ``i / length`` (the paper's pos / 512);
- ``segment``: the index of its segment, counted from 0 at the window's first token;
- ``intra_segment``: ``(i - first index of its segment) / (segment length - 1)`` within the window, 0 for a
  one-token segment.

Special tokens get no targets: the probes read content tokens only.
"""

import bisect
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...training.sources import load_documents

logger = logging.getLogger(__name__)

TARGETS = ("position", "segment", "intra_segment")
TARGET_LABELS = {
    "position": "token-level AP (Table 2)",
    "segment": "segment-level AP (Table 3)",
    "intra_segment": "intra-segment AP (Table 4)",
}
SEGMENT_END = re.compile(r"[.!?](?=\s|$)|\n")
DEFAULT_TEXT = Path("../shared/data/text/wikitext2_test.txt")
"""The WikiText-2 test split beside the project (see ../shared/data/README.md); the embedded corpus otherwise."""
FIT_DOCUMENTS, SCORE_DOCUMENTS = 400, 100
"""The paper's probe documents: each probe is fitted on 400 and scored on the other 100."""
PAPER_DOCUMENTS = FIT_DOCUMENTS + SCORE_DOCUMENTS
"""The documents of every analysis in the paper (the head taxonomy averages over all 500)."""
SPLIT_SEEDS = (0, 1, 2, 3, 4)
"""The seeds of the paper's five random fit/score splits of the probe documents."""


@dataclass
class ProbeDocument:
    """One model input and its targets. ``input_ids`` (length,) with [CLS] first and [SEP] last; ``segments``
    (length - 2,) the segment index of every content token."""

    input_ids: list
    segments: np.ndarray

    @property
    def content_length(self):
        return len(self.segments)

    def targets(self, length):
        """{target name: (content tokens,) float array}; `length` is the model length positions are divided by."""
        return {
            "position": np.arange(1, self.content_length + 1) / length,
            "segment": self.segments.astype(float),
            "intra_segment": intra_segment_positions(self.segments),
        }


def intra_segment_positions(segments):
    """(n,) progress of every token within its run of equal segment ids: 0 at the first token, 1 at the last."""
    segments = np.asarray(segments)
    starts = np.flatnonzero(np.r_[True, segments[1:] != segments[:-1]])
    ends = np.r_[starts[1:], len(segments)]
    progress = np.zeros(len(segments))
    for start, end in zip(starts, ends, strict=True):
        if end - start > 1:
            progress[start:end] = np.arange(end - start) / (end - start - 1)
    return progress


def segment_starts(text):
    """Character offsets at which a new segment starts (just after each segment end)."""
    return [match.end() for match in SEGMENT_END.finditer(text)]


def token_segments(text, offsets):
    """Segment index of every token of `text` from its character offsets ((start, end) pairs): the number of
    segment starts at or before the token's first character."""
    starts = segment_starts(text)
    return np.array([bisect.bisect_right(starts, start) for start, _ in offsets], dtype=np.int64)


def tokenize_with_segments(texts, tokenizer):
    """Token ids (no special tokens) of the concatenated `texts` and the global segment index of each token."""
    all_ids, all_segments, offset = [], [], 0
    for text in texts:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        if not encoded["input_ids"]:
            continue
        # Consecutive ends (a blank line, "?!") would leave empty segments: number the non-empty ones densely.
        segments = np.unique(token_segments(text, encoded["offset_mapping"]), return_inverse=True)[1] + offset
        all_ids.extend(encoded["input_ids"])
        all_segments.append(segments)
        offset = int(segments[-1]) + 1  # a text ends its last segment
    return all_ids, (np.concatenate(all_segments) if all_segments else np.zeros(0, dtype=np.int64))


def special_ids(tokenizer):
    """([CLS], [SEP]) ids of the tokenizer; a clear error when it has neither."""
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(
            f"the tokenizer {type(tokenizer).__name__} has no [CLS]/[SEP] (or BOS/EOS) token to wrap probe documents in"
        )
    return cls_id, sep_id


def build_probe_documents(texts, tokenizer, length, count=None):
    """Consecutive windows of ``length`` tokens ([CLS] + length - 2 content tokens + [SEP]) over the
    concatenated `texts`, at most `count` of them (all full windows when None). Segment ids restart at 0 in
    every window."""
    if length < 3:
        raise ValueError(f"length={length} must be >= 3: [CLS], at least one token, [SEP]")
    cls_id, sep_id = special_ids(tokenizer)
    ids, segments = tokenize_with_segments(texts, tokenizer)
    width = length - 2
    documents = []
    for start in range(0, len(ids) - width + 1, width):
        if count is not None and len(documents) == count:
            break
        window = segments[start : start + width]
        documents.append(ProbeDocument([cls_id, *ids[start : start + width], sep_id], window - window[0]))
    if count is not None and len(documents) < count:
        logger.warning(
            "the texts give %d probe documents of %d tokens, fewer than the %d asked for", len(documents), length, count
        )
    return documents


def load_texts(source=None, limit=None):
    """Texts for probe documents: `source` (a text file, folder, Hub dataset id or ``embedded``, as
    `encoderlab.training.sources.load_documents` reads them), by default WikiText-2 where present."""
    if source is None:
        source = str(DEFAULT_TEXT) if DEFAULT_TEXT.is_file() else "embedded"
    return list(load_documents(source, limit=limit))


def repeated_document(texts, tokenizer, part_length):
    """DOC-A + DOC-B + DOC-A (Figure 3): the first `part_length` tokens of two different texts, A repeated
    after B, wrapped in [CLS] ... [SEP]. Returns input_ids and the (start, end) span of each part."""
    cls_id, sep_id = special_ids(tokenizer)
    parts = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= part_length:
            parts.append(ids[:part_length])
        if len(parts) == 2:
            break
    if len(parts) < 2:
        raise ValueError(f"DOC-A + DOC-B + DOC-A needs two texts of at least {part_length} tokens")
    doc_a, doc_b = parts
    input_ids = [cls_id, *doc_a, *doc_b, *doc_a, sep_id]
    spans = [(1 + k * part_length, 1 + (k + 1) * part_length) for k in range(3)]
    return input_ids, spans
