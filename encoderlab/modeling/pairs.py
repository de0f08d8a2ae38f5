"""Separate encoding of text pairs (``config.classifier_pair_encoding="separate"``): a tokenised pair, ``[CLS] a [SEP]
[CLS] b [SEP]`` (`encoderlab.tokenization.pairs`, each text as it is written alone) or the usual ``[CLS] a [SEP] b
[SEP]``, is cut after its first separator into two segments that the encoder treats as packed documents (attention
and positions restart at the cut), so each text is encoded without seeing the other. The sequence head then reads
the two mean-pooled texts as ``[u, v, |u - v|, u * v]``.

Packed rows of pairs (``position_ids`` restarting at 0, or ``cu_seq_lens``) are cut the same way inside each pair.
"""

import torch

from .documents import flat_documents, forward_fill, run_starts


def pair_segments(input_ids, attention_mask, document_ids, sep_token_id):
    """Segment ids and positions of pairs cut after their first separator.

    input_ids (B, L); attention_mask (B, L) or None; document_ids (B, L) of packed pairs or None for one pair per
    row. Returns segment_ids (B, L) long, ``2 * pair + (token is after the pair's first separator)``, and
    position_ids (B, L) counting the real tokens of each segment from 0 (padding repeats a neighbour's position and
    stays masked), the convention the encoder reads packed documents from.
    """
    if document_ids is None:
        document_ids = torch.zeros_like(input_ids)
    is_sep = (input_ids == sep_token_id).long()
    seps_before = is_sep.cumsum(dim=-1) - is_sep  # separators strictly before each token, along the row
    seps_at_pair_start = forward_fill(seps_before, run_starts(document_ids))
    second_text = (seps_before - seps_at_pair_start > 0).long()
    segment_ids = 2 * document_ids + second_text

    real = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    real_so_far = real.cumsum(dim=-1)
    before_segment = forward_fill(real_so_far - real, run_starts(segment_ids))
    position_ids = (real_so_far - before_segment - 1).clamp(min=0)
    return segment_ids, position_ids


def count_real_runs(ids, attention_mask):
    """How many distinct ids the real tokens hold, row by row: ids (B, L) non-decreasing along each row."""
    real = None if attention_mask is None else attention_mask.bool()
    _, starts = flat_documents(ids, real, *ids.shape, ids.device)
    return int(starts.sum())


def pair_features(pooled):
    """(2N, D) texts pooled in row-major order, a then b per pair -> (N, 4D) ``[u, v, |u - v|, u * v]``."""
    first, second = pooled[0::2], pooled[1::2]
    return torch.cat([first, second, (first - second).abs(), first * second], dim=-1)
