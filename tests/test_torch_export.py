"""Deployment: every family and preset goes through torch.export (static and dynamic sequence length) and
torch.compile(fullgraph=True) and gives the eager outputs; DTA-BERT runs in onnxruntime through torch.onnx.

Traced graphs may not branch on tensor values, so these tests pin what the models do instead: the mask takes the
padded path whenever one is given, HOMA's block grid is sized from the length, the triadic kernel is one custom
operator. Each exported program is run on batches it was not traced with (the other padding side, another length,
no padding at all) and compared with the eager model on the same inputs.
"""

import pytest
import torch
from test_family_contract import CASES, PAD, VOCAB, build, padded_batch

ATOL = 2e-5  # fp32 logits of order 1; a traced graph may pick other kernels or reduction orders than eager
MAX_LENGTH = 24  # max_position_embeddings of every CASES config (the learned tables' and Linformer's width)


def float_model(name, **overrides):
    return build(name, dtype=torch.float32, **overrides)


def random_batch(lengths, seq_len, side, seed):
    """Rows of random tokens of ``lengths`` padded to ``seq_len`` on ``side``: ids and mask (B, L)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), seq_len), PAD)
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(seq_len - length, seq_len) if side == "left" else slice(0, length)
        ids[row, span] = torch.randint(1, VOCAB, (length,), generator=generator)
        mask[row, span] = 1
    return ids, mask


def assert_same_logits(program, model, ids, mask):
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        actual = program(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()  # padded rows carry no meaning (and differ between kernels)
    torch.testing.assert_close(actual[real], expected[real], rtol=0, atol=ATOL)


def export(model, ids, mask, dynamic):
    shapes = None
    if dynamic:
        batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=MAX_LENGTH)
        shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    with torch.no_grad():
        return torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask}, dynamic_shapes=shapes)


# ----------------------------------------------------------------------------------------------------------------
# torch.export


@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_shape_export_matches_eager_on_other_paddings_lengths_and_batch_sizes(name):
    model = float_model(name)
    ids, mask = padded_batch("left")  # traced at length 10, rows of 10, 7 and 4 tokens
    program = export(model, ids, mask, dynamic=True).module()
    assert_same_logits(program, model, ids, mask)
    assert_same_logits(program, model, *padded_batch("right", seed=1))
    # Other lengths, across HOMA's block size (6) and stride (4), the full learned table, no padding at all, and
    # other batch sizes.
    for seq_len, lengths, side in [
        (3, [3, 2, 1], "right"),
        (17, [17, 9, 5, 12], "left"),
        (6, [6, 6], "right"),
        (MAX_LENGTH, [24, 23, 13], "right"),
        (13, [5], "left"),
    ]:
        assert_same_logits(program, model, *random_batch(lengths, seq_len, side, seed=seq_len))


@pytest.mark.parametrize("name", ["dta-dual_triangle-alibi", "dstg-dstg"])
def test_eager_attention_implementation_exports_too(name):
    """The materialised-scores path (dense masks and biases) under a dynamic length."""
    model = float_model(name)
    model.set_attn_implementation("eager")
    ids, mask = padded_batch("left")
    program = export(model, ids, mask, dynamic=True).module()
    assert_same_logits(program, model, *random_batch([17, 9, 5], 17, "right", seed=1))


def test_dynamic_length_export_spans_the_lengths_where_eager_splits_causal_attention():
    """Eager splits a causal sdpa call of 256..512 tokens on CPU; the exported program must not pin the length to
    either side of that range, and gives the same outputs inside it."""
    model = float_model("dta-dual_triangle-none")
    ids, mask = padded_batch("left")
    length = torch.export.Dim("length", min=2, max=1024)
    with torch.no_grad():
        program = torch.export.export(
            model,
            (),
            {"input_ids": ids, "attention_mask": mask},
            dynamic_shapes={"input_ids": {1: length}, "attention_mask": {1: length}},
        )
    assert_same_logits(program.module(), model, *random_batch([300, 180, 41], 300, "left", seed=300))


@pytest.mark.parametrize("name", ["dta-unet-value-embeddings", "homa-homa-mlp", "dstg-dstg"])
def test_static_length_export_matches_eager_and_refuses_other_lengths(name):
    model = float_model(name)
    ids, mask = padded_batch("right")
    program = export(model, ids, mask, dynamic=False).module()
    assert_same_logits(program, model, ids, mask)
    assert_same_logits(program, model, *padded_batch("left", seed=2))
    assert_same_logits(program, model, *random_batch([10, 10, 10], 10, "right", seed=3))
    with pytest.raises(Exception, match=r"input_ids.size\(\)\[1\] == 10"):  # names the length it was traced with
        program(input_ids=ids[:, :9], attention_mask=mask[:, :9])


@pytest.mark.parametrize("name", ["homa-linformer", "dta-dual_triangle-absolute"])
def test_a_dynamic_length_wider_than_the_position_table_is_refused_with_the_bound(name):
    ids, mask = padded_batch("left")
    length = torch.export.Dim("length", min=2, max=4 * MAX_LENGTH)
    with pytest.raises(Exception, match=f"max={MAX_LENGTH}"), torch.no_grad():  # torch suggests the fix
        torch.export.export(
            float_model(name),
            (),
            {"input_ids": ids, "attention_mask": mask},
            dynamic_shapes={"input_ids": {1: length}, "attention_mask": {1: length}},
        )


def test_exported_program_without_a_mask_matches_eager():
    model = float_model("dta-dual_triangle-alibi")
    ids = torch.randint(1, VOCAB, (2, 9))
    length = torch.export.Dim("length", min=2, max=MAX_LENGTH)
    with torch.no_grad():
        program = torch.export.export(model, (), {"input_ids": ids}, dynamic_shapes={"input_ids": {1: length}}).module()
        for seq_len in (9, 15):
            ids = torch.randint(1, VOCAB, (2, seq_len))
            torch.testing.assert_close(program(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=ATOL)


def test_homa_grid_of_a_traced_length_covers_every_position_and_keeps_the_outputs():
    """The traced grid has more blocks than eager's exact count; the extra ones are masked out of the merge."""
    from encoderlab.modeling.kernels.blocks import grid_blocks

    for block_size, stride in [(6, 4), (30, 15), (7, 7), (5, 1)]:
        for seq_len in range(1, 80):
            exact = grid_blocks(seq_len, block_size, stride)
            assert (exact - 1) * stride + block_size >= seq_len  # the last block reaches the last position
            assert exact == 1 or (exact - 2) * stride + block_size < seq_len  # and no block is spare
            assert (seq_len - 1) // stride + 2 >= exact  # the traced count is never fewer


# ----------------------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)

# One case per code path that could break a graph: each position scheme (the U-Net case has RoPE), the additive
# bias in each triangle kernel, every HOMA attention module, every DSTG preset.
COMPILED = [
    "dta-dual_triangle-none",
    "dta-dual_triangle-sinusoidal",
    "dta-causal-absolute",
    "dta-bidirectional-alibi",
    "dta-dual_triangle-alibi",
    "dta-unet-value-embeddings",
    "homa-pairwise",
    "homa-linformer",
    "homa-triadic",
    "homa-homa-gated",
    "dstg-dstg",
    "dstg-ap",
    "dstg-rp",
    "dstg-rope",
]


@pytest.mark.parametrize("name", COMPILED)
def test_fullgraph_compile_has_no_graph_break_and_matches_eager(name):
    """fullgraph=True raises at the first graph break; HOMA's triadic kernel is a custom op, so no family breaks."""
    torch._dynamo.reset()
    model = float_model(name)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    for side in ("left", "right"):
        ids, mask = padded_batch(side)
        assert_same_logits(compiled, model, ids, mask)


@pytest.mark.parametrize("name", ["dta-dual_triangle-none", "homa-homa-mlp"])
def test_fullgraph_compile_with_a_dynamic_length_matches_eager(name):
    """A symbolic length reaches the causal sdpa split and HOMA's grid size, which must not break the graph."""
    torch._dynamo.reset()
    model = float_model(name)
    compiled = torch.compile(model, fullgraph=True, backend="eager", dynamic=True)
    for seq_len, lengths in [(10, [10, 7, 4]), (17, [17, 3, 9])]:
        assert_same_logits(compiled, model, *random_batch(lengths, seq_len, "left", seed=seq_len))


def test_compiled_training_step_gives_the_eager_loss_and_gradients():
    """Under aot_eager the triadic custom op's backward runs from the compiled graph."""
    torch._dynamo.reset()
    model = float_model("homa-homa-mlp").train()
    ids, mask = padded_batch("left")
    labels = torch.where(mask.bool() & (torch.arange(10) % 3 == 0), ids, -100)

    def loss_and_gradients(forward):
        model.zero_grad()
        loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager_gradients = loss_and_gradients(model)
    compiled_loss, compiled_gradients = loss_and_gradients(torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=0, atol=ATOL)
    assert compiled_gradients.keys() == eager_gradients.keys()
    assert any("u_projection" in name for name in eager_gradients)  # the triadic pathway is in the graph
    for name, gradient in eager_gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, rtol=1e-4, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# ONNX


def test_dta_bert_onnx_export_runs_in_onnxruntime_with_the_eager_logits(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (test extras)")
    model = float_model("dta-dual_triangle-rope")
    ids, mask = padded_batch("left")
    length = torch.export.Dim("length", min=2, max=MAX_LENGTH)
    path = tmp_path / "dta_bert.onnx"
    with torch.no_grad():
        torch.onnx.export(
            model,
            (),
            path,
            kwargs={"input_ids": ids, "attention_mask": mask},
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_shapes={"input_ids": {1: length}, "attention_mask": {1: length}},
            dynamo=True,
            verbose=False,
        )
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [tensor.name for tensor in session.get_outputs()] == ["logits"]
    for batch_ids, batch_mask in [
        (ids, mask),
        padded_batch("right", seed=1),
        random_batch([17, 11, 4], 17, "left", seed=5),
    ]:
        (logits,) = session.run(None, {"input_ids": batch_ids.numpy(), "attention_mask": batch_mask.numpy()})
        with torch.no_grad():
            expected = model(input_ids=batch_ids, attention_mask=batch_mask).logits
        real = batch_mask.bool()
        torch.testing.assert_close(torch.from_numpy(logits)[real], expected[real], rtol=0, atol=1e-4)
