"""HOMA on packed rows (transformers' padding-free convention: position_ids restart at 0 where a document begins):
every attention type gives each document of a packed row exactly what that document gives alone, and no document's
loss reaches another's inputs. The block grid is checked slot by slot against a slow per-document reference.

Why "the document run alone" is well defined for the block types: the grid is anchored on each document's first
token (as it is on a lone sequence's first real token), so a document's blocks are a function of its own length.
A grid laid over the whole row would cut a document wherever the pack happens to place it; those outputs would
depend on the neighbours' lengths, and no single "alone" result would exist to compare against.
"""

import pytest
import torch
from transformers import DataCollatorWithFlattening

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import HOMAForMaskedLM, LinformerSelfAttention, prepare_homa_inputs
from encoderlab.modeling.kernels.blocks import BlockLayout

TINY = dict(
    hidden_size=16,
    num_attention_heads=2,
    num_hidden_layers=2,
    intermediate_size=32,
    u_rank=4,
    fusion_hidden_size=8,
    linformer_k=5,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_dropout=0.0,
)
ATTENTION_TYPES = ["pairwise", "blockwise", "homa", "triadic", "linformer"]
# (block_size, block_stride, triadic_window): overlapping, touching and thrice-overlapping grids.
GRIDS = [(6, 4, 3), (5, 5, 5), (7, 3, 3)]
# Packs of document lengths, then padding after the pack: documents shorter than a block (1, 2), exactly one block,
# one token more, odd lengths, long ones; the two rows of a batch hold different packs.
PACKS = [([1, 6, 2, 13, 7], [9, 1, 1, 17, 3]), ([23, 5], [4, 8, 11, 2, 3])]


def model_for(attention_type, grid, position_embedding_type="absolute", seed=0):
    block_size, block_stride, window = grid
    torch.manual_seed(seed)
    config = HOMAConfig(
        **TINY,
        attention_type=attention_type,
        block_size=block_size,
        block_stride=block_stride,
        triadic_window=window,
        position_embedding_type=position_embedding_type,
    )
    return HOMAForMaskedLM(config).double().eval()


def documents_of(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 30, (length,), generator=generator) for length in lengths]


def pack(rows_of_documents, padding, padding_positions="restart"):
    """input_ids, attention_mask, position_ids (B, L) of packed rows with ``padding`` pad tokens after the longest
    pack; padding's position_ids restart at 0 (a packer's filler) or continue the last document's."""
    seq_len = max(sum(len(d) for d in documents) for documents in rows_of_documents) + padding
    input_ids = torch.zeros(len(rows_of_documents), seq_len, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    position_ids = torch.zeros_like(input_ids)
    for row, documents in enumerate(rows_of_documents):
        used = sum(len(d) for d in documents)
        input_ids[row, :used] = torch.cat(documents)
        attention_mask[row, :used] = 1
        position_ids[row, :used] = torch.cat([torch.arange(len(d)) for d in documents])
        start = 0 if padding_positions == "restart" else len(documents[-1])
        position_ids[row, used:] = torch.arange(start, start + seq_len - used)
    return input_ids, attention_mask, position_ids


def document_ids_from_positions(position_ids):
    """The contract, computed here on its own: a document starts where position_ids is 0 (and at each row's start)."""
    starts = position_ids == 0
    starts[:, 0] = True
    return starts.long().cumsum(-1) - 1


def spans(rows_of_documents):
    """(row, start, stop, document) of every document."""
    for row, documents in enumerate(rows_of_documents):
        start = 0
        for document in documents:
            yield row, start, start + len(document), document
            start += len(document)


# ----------------------------------------------------------------------------------------------------------------
# The block grid against a slow reference


def reference_blocks(lengths, block_size, stride):
    """Per document, in order: the positions of each block, the grid a lone sequence of that length gets (from its
    first token, every ``stride``, until the last token is covered, the last block cut at the document's end)."""
    blocks, start = [], 0
    for length in lengths:
        block_start = start
        while True:
            blocks.append(list(range(block_start, min(block_start + block_size, start + length))))
            if block_start + block_size >= start + length:
                break
            block_start += stride
        start += length
    return blocks


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("padding_positions", ["restart", "continue"])
def test_block_grid_is_the_per_document_reference(grid, padding_positions):
    block_size, stride, _ = grid
    for lengths_of_rows in PACKS:
        rows = [documents_of(lengths, seed) for seed, lengths in enumerate(lengths_of_rows)]
        _, attention_mask, position_ids = pack(rows, padding=3, padding_positions=padding_positions)
        document_ids = document_ids_from_positions(position_ids)
        layout = BlockLayout.from_documents(attention_mask, document_ids, block_size, stride)
        for row, lengths in enumerate(lengths_of_rows):
            expected = reference_blocks(lengths, block_size, stride)
            index = layout.index[row].view(layout.num_blocks, block_size)
            used = layout.key_mask[row]
            got = [index[t][used[t]].tolist() for t in range(layout.num_blocks) if used[t].any()]
            assert got == expected
            # Merge weights: 1 / (blocks covering the position) on used slots, 0 elsewhere.
            coverage = torch.zeros(attention_mask.shape[1], dtype=torch.float64)
            for block in expected:
                coverage[block] += 1
            expected_weight = torch.where(used, 1 / coverage[index].clamp(min=1), 0.0)
            torch.testing.assert_close(layout.merge_weight[row].double(), expected_weight)
            # No slot, used or not, reads a token of another document than its block's (or padding).
            for t in range(layout.num_blocks):
                if used[t].any():
                    block_document = document_ids[row, index[t][used[t]][0]]
                    assert bool((document_ids[row, index[t]] == block_document).all())
                    assert bool(attention_mask[row, index[t]].all())


def test_block_grid_of_one_document_per_row_is_the_unpacked_grid():
    """One document per row, padded: the per-document grid uses the blocks (and weights) `from_mask` uses."""
    attention_mask = torch.tensor([[1] * 17 + [0] * 4, [1] * 21])
    packed = BlockLayout.from_documents(attention_mask, torch.zeros_like(attention_mask), 6, 4)
    unpacked = BlockLayout.from_mask(attention_mask, 6, 4)
    real_slots = unpacked.key_mask
    assert torch.equal(packed.key_mask, real_slots)
    torch.testing.assert_close(
        packed.index.view_as(real_slots)[real_slots], unpacked.index.view_as(real_slots)[real_slots]
    )


# ----------------------------------------------------------------------------------------------------------------
# Models: each document of a packed row gives what it gives alone


def alone(model, document):
    out = model(input_ids=document[None], output_hidden_states=True)
    return [h[0] for h in out.hidden_states], out.logits[0]


def assert_documents_match_alone(model, rows, out, atol=1e-10):
    for row, start, stop, document in spans(rows):
        hidden_alone, logits_alone = alone(model, document)
        for packed_hidden, lone_hidden in zip(out.hidden_states, hidden_alone, strict=True):
            torch.testing.assert_close(packed_hidden[row, start:stop], lone_hidden, rtol=0, atol=atol)
        torch.testing.assert_close(out.logits[row, start:stop], logits_alone, rtol=0, atol=atol)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("pack_index", range(len(PACKS)))
def test_packed_documents_match_each_document_alone(attention_type, grid, pack_index):
    model = model_for(attention_type, grid)
    rows = [documents_of(lengths, seed) for seed, lengths in enumerate(PACKS[pack_index])]
    input_ids, attention_mask, position_ids = pack(rows, padding=5)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
    )
    assert_documents_match_alone(model, rows, out)


@pytest.mark.parametrize("attention_type", [*ATTENTION_TYPES, "pairwise-eager", "pairwise-flex_attention"])
@pytest.mark.usefixtures("uncompiled_flex")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_first_row_of_one_whole_document_keeps_later_rows_packed(attention_type):
    """Row 0 one document without padding, row 1 several (filling it, then not): a batch whose first row, looked at
    alone, shows neither packing nor padding."""
    attention_type, _, implementation = attention_type.partition("-")
    model = model_for(attention_type, GRIDS[0])
    if implementation:
        model.set_attn_implementation(implementation)
    for seed, later_row in enumerate(([5, 1, 9, 8], [5, 1, 9])):
        rows = [documents_of([23], seed), documents_of(later_row, seed + 1)]
        input_ids, attention_mask, position_ids = pack(rows, padding=0)
        assert bool(attention_mask[0].all()) and input_ids.shape[1] == 23
        with torch.no_grad():  # flex_attention has no CPU backward: with gradients on it would run sdpa instead
            out = model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
            )
            assert_documents_match_alone(model, rows, out)


@pytest.mark.parametrize("attention_type", ["pairwise", "blockwise", "homa", "triadic"])
def test_packed_documents_match_alone_with_rope_and_continued_padding_positions(attention_type):
    model = model_for(attention_type, GRIDS[0], position_embedding_type="rope")
    rows = [documents_of(lengths, seed + 7) for seed, lengths in enumerate(PACKS[0])]
    input_ids, attention_mask, position_ids = pack(rows, padding=4, padding_positions="continue")
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
    )
    assert_documents_match_alone(model, rows, out)


def test_pairwise_eager_keeps_packed_documents_apart():
    """The pairwise arm goes through the shared attention path; sdpa is covered above."""
    model = model_for("pairwise", GRIDS[0])
    model.set_attn_implementation("eager")
    rows = [documents_of(lengths, seed + 3) for seed, lengths in enumerate(PACKS[1])]
    input_ids, attention_mask, position_ids = pack(rows, padding=2)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
    )
    assert_documents_match_alone(model, rows, out)


def test_pairwise_flex_attention_gives_the_packed_sdpa_result():
    """flex_attention's CPU forward (float32 at most, no backward: so under no_grad) on the same packed rows gives
    what sdpa gives, which the tests above hold to each document alone. One packed call: every other shape would
    compile flex again."""
    model = model_for("pairwise", GRIDS[0]).float()
    rows = [documents_of(lengths, seed + 3) for seed, lengths in enumerate(PACKS[1])]
    inputs = dict(zip(("input_ids", "attention_mask", "position_ids"), pack(rows, padding=2), strict=True))
    with torch.no_grad():
        expected = model(**inputs).logits
        model.set_attn_implementation("flex_attention")
        logits = model(**inputs).logits
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[real], expected[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention_type", ["blockwise", "homa", "linformer"])
def test_a_document_gives_the_same_wherever_the_pack_puts_it(attention_type):
    """The same document after prefixes of every length modulo the stride: the outputs must not follow the pack's
    offset (a grid laid over the row would put the document's block edges elsewhere for each prefix)."""
    model = model_for(attention_type, GRIDS[0])
    document = documents_of([11], seed=3)[0]
    expected = alone(model, document)[1]
    for prefix_length in range(1, 6):
        rows = [[documents_of([prefix_length], seed=prefix_length)[0], document]]
        input_ids, attention_mask, position_ids = pack(rows, padding=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        torch.testing.assert_close(logits[0, prefix_length:], expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_flattening_collator_output_gives_each_document_alone(attention_type):
    """`DataCollatorWithFlattening` output (one row, position_ids and cu_seq_lens) fed to the model unchanged."""
    model = model_for(attention_type, GRIDS[2])
    documents = documents_of([9, 2, 14, 5], seed=11)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_tensors="pt")
    features = collator([{"input_ids": d.tolist()} for d in documents])
    features.pop("labels")
    out = model(**features, output_hidden_states=True)
    assert_documents_match_alone(model, [documents], out)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_no_gradient_crosses_a_document_boundary(attention_type):
    model = model_for(attention_type, GRIDS[0])
    rows = [documents_of(lengths, seed) for seed, lengths in enumerate(PACKS[0])]
    input_ids, attention_mask, position_ids = pack(rows, padding=3)
    embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids).logits
    for row, start, stop, _ in spans(rows):
        (grad,) = torch.autograd.grad(logits[row, start:stop].square().sum(), embeds, retain_graph=True)
        inside = torch.zeros_like(attention_mask, dtype=torch.bool)
        inside[row, start:stop] = True
        assert bool(grad[inside].abs().sum(-1).gt(0).all())  # every token of the document reaches its own loss
        assert bool((grad[~inside] == 0).all()), f"document {row}:{start}-{stop} reaches another document's inputs"


# ----------------------------------------------------------------------------------------------------------------
# Linformer's limits


def test_linformer_refuses_to_export_packed_rows(monkeypatch):
    config = HOMAConfig(**TINY, attention_type="linformer")
    layer = LinformerSelfAttention(config)
    document_ids, hidden = torch.tensor([[0, 0, 0, 1, 1, 1]]), torch.randn(1, 6, 16)
    layer(hidden, prepare_homa_inputs(layer, None, document_ids, hidden))  # eager runs it
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    with pytest.raises(ValueError, match="linformer attention cannot export packed rows"):
        layer(hidden, prepare_homa_inputs(layer, None, document_ids, hidden))
