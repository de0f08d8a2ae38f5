"""Packed (padding-free) input, model side: every DTA attention type x position scheme x CPU backend and every DSTG
preset give, for each document of a packed row, what that document gives alone; no gradient crosses documents;
`DataCollatorWithFlattening` output works unchanged; the packed MLM loss is the token-weighted unpacked one; the
``varlen`` plumbing (flattening, cu_seq_lens, windows, unflattening) is right on CPU with a reference kernel."""

import pytest
import torch
from transformers import DataCollatorWithFlattening

import encoderlab.modeling.kernels.varlen as varlen_module
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.modeling.attention import ALL_ATTENTION_FUNCTIONS, ATTENTION_INPUTS, attend
from encoderlab.modeling.documents import (
    document_bounds,
    document_ids_from_positions,
    packed_document_ids,
    positions_in_documents,
)
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM, DSTGNeoBERTForSequenceClassification
from encoderlab.modeling.dta import DTABertForMaskedLM, DTABertForSequenceClassification
from encoderlab.modeling.kernels.common import allowed_mask
from encoderlab.modeling.kernels.sdpa import key_spans, row_key_spans, row_runs
from encoderlab.modeling.positions import ALiBiBias

pytestmark = pytest.mark.usefixtures("one_thread", "uncompiled_flex")

TYPES = ["bidirectional", "causal", "dual_triangle"]
POSITIONS = ["none", "absolute", "sinusoidal", "rope", "alibi"]
BACKENDS = ["eager", "sdpa", "flex_attention"]
PRESETS = ["dstg", "ap", "rp", "rope"]
CLS, SEP, PAD = 1, 2, 0
SEQ_LEN = 20
# Two packed rows of odd-length documents; the first ends in padding after its pack.
LAYOUT = [[5, 1, 7, 3], [9, 4, 7]]
TOLERANCE = 1e-10


def dta_model(attention_type="dual_triangle", position="rope", backend="sdpa", **overrides):
    unet = position in ("none", "rope")  # the U-Net body and value embeddings on a subset
    config = DTABertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=4 if unet else 2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        initializer_range=0.3,
        attention_type=attention_type,
        position_embedding_type=position,
        unet=unet,
        value_embeddings=unet,
        attn_implementation=backend,
        **overrides,
    )
    return randomised(DTABertForMaskedLM(config))


def dstg_model(preset="dstg", backend="sdpa"):
    sizes = dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=24)
    config = DSTGNeoBERTConfig(
        preset=preset,
        vocab_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        cls_token_id=CLS,
        sep_token_id=SEP,
        pad_token_id=PAD,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=6,
        attn_implementation=backend,
        **sizes,
    )
    return randomised(DSTGNeoBERTForMaskedLM(config))


def randomised(model, seed=0):
    """Random weights everywhere (zero-initialised scalars and bias tables included), fp64, eval."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.double().eval()


def documents(layout, seed=0):
    """Random documents of the given lengths, each [CLS] ... [SEP] when longer than 2 tokens."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for length in layout:
        ids = torch.randint(4, 40, (length,), generator=generator)
        if length > 2:
            ids[0], ids[-1] = CLS, SEP
        found.append(ids)
    return found


def pack(rows, seq_len=SEQ_LEN):
    """Rows of documents -> input_ids, position_ids (restarting at 0 in each document), attention_mask (0 for the
    padding after the pack), all (len(rows), seq_len), and each document's (row, start) span."""
    input_ids = torch.full((len(rows), seq_len), PAD)
    position_ids = torch.zeros(len(rows), seq_len, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), seq_len, dtype=torch.long)
    spans = []
    for row, docs in enumerate(rows):
        start = 0
        for doc in docs:
            end = start + len(doc)
            input_ids[row, start:end], position_ids[row, start:end] = doc, torch.arange(len(doc))
            attention_mask[row, start:end] = 1
            spans.append((row, start, end))
            start = end
    return input_ids, position_ids, attention_mask, spans


def packed_case(layout=LAYOUT, seed=0):
    docs = documents([n for row in layout for n in row], seed)
    rows, index = [], 0
    for row in layout:
        rows.append(docs[index : index + len(row)])
        index += len(row)
    return docs, pack(rows)


def alone(model, doc, **kwargs):
    with torch.no_grad():
        return model(input_ids=doc[None], output_hidden_states=True, **kwargs)


def assert_each_document_as_alone(model, docs, packed_output, spans):
    for doc, (row, start, end) in zip(docs, spans, strict=True):
        expected = alone(model, doc)
        assert (packed_output.logits[row, start:end] - expected.logits[0]).abs().max() <= TOLERANCE
        for got, want in zip(packed_output.hidden_states, expected.hidden_states, strict=True):
            assert (got[row, start:end] - want[0]).abs().max() <= TOLERANCE


def run_packed(model, input_ids, position_ids, attention_mask):
    with torch.no_grad():
        return model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, output_hidden_states=True
        )


# ----------------------------------------------------------------------------------------------------------------
# documents from positions and boundaries


def test_document_ids_restart_where_positions_restart():
    positions = torch.tensor([[0, 1, 2, 0, 0, 1], [3, 4, 0, 1, 2, 3]])
    assert document_ids_from_positions(positions).tolist() == [[0, 0, 0, 1, 2, 2], [0, 0, 1, 1, 1, 1]]
    ids = packed_document_ids(positions, None, 2, 6, "cpu")
    assert ids.tolist() == [[0, 0, 0, 1, 2, 2], [0, 0, 1, 1, 1, 1]]
    assert positions_in_documents(ids).tolist() == [[0, 1, 2, 0, 0, 1], [0, 1, 0, 1, 2, 3]]
    # One document per row (positions that never restart, or none given): no document mask, the fast paths stay.
    assert packed_document_ids(torch.arange(6)[None] + 2, None, 2, 6, "cpu") is None
    assert packed_document_ids(None, None, 2, 6, "cpu") is None
    # Boundaries over the flattened batch: documents [0, 4), [4, 6) | [6, 9), [9, 12).
    cu_seq_lens = torch.tensor([0, 4, 6, 9, 12], dtype=torch.int32)
    ids = packed_document_ids(None, cu_seq_lens, 2, 6, "cpu")
    assert positions_in_documents(ids).tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]


@pytest.mark.parametrize(
    "cu_seq_lens,message",
    [
        (torch.tensor([[0, 5]]), "cu_seq_lens_q must be a 1-D tensor"),
        (torch.tensor([0.0, 5.0]), "cu_seq_lens_q must hold integers"),
        (torch.tensor([1, 5, 12]), r"cu_seq_lens_q holds \[1, 5, 12\]; allowed: cumulative lengths from 0"),
        (torch.tensor([0, 7, 5, 12]), "non-decreasing"),
        (torch.tensor([0, 5, 13]), "ending at most at batch_size \\* seq_len = 12"),
        (torch.tensor([0, 5, 12]), "no boundary at token 6, the start of row 1"),
    ],
)
def test_bad_boundaries_raise_errors_naming_the_field(cu_seq_lens, message):
    model = dta_model()
    with pytest.raises(ValueError, match=message):
        model(input_ids=torch.randint(4, 40, (2, 6)), cu_seq_lens_q=cu_seq_lens)
    with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k differ"):
        model(
            input_ids=torch.randint(4, 40, (2, 6)),
            cu_seq_lens_q=torch.tensor([0, 6, 12]),
            cu_seq_lens_k=torch.tensor([0, 3, 6, 12]),
        )


# ----------------------------------------------------------------------------------------------------------------
# per-document equality


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention_type", TYPES)
def test_dta_packed_rows_give_each_document_alone(attention_type, position, backend):
    model = dta_model(attention_type, position, backend)
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case()
    output = run_packed(model, input_ids, position_ids, attention_mask)
    assert_each_document_as_alone(model, docs, output, spans)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preset", PRESETS)
def test_dstg_packed_rows_give_each_document_alone(preset, backend):
    model = dstg_model(preset, backend)
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case([[7, 1, 9], [5, 12]], seed=1)
    output = run_packed(model, input_ids, position_ids, attention_mask)
    assert_each_document_as_alone(model, docs, output, spans)
    if preset == "dstg":  # the streams too
        for doc, (row, start, end) in zip(docs, spans, strict=True):
            expected = alone(model.model, doc)
            with torch.no_grad():
                got = model.model(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    attention_mask=attention_mask,
                    output_hidden_states=True,
                )
            for name in ("ap_hidden_states", "semantic_hidden_states"):
                for got_state, want in zip(got[name], expected[name], strict=True):
                    assert (got_state[row, start:end] - want[0]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("layout,seq_len", [([[3, 3]], 6), ([[1, 1, 1], [2, 1]], 3), ([[11, 2, 6], [19]], 19)])
def test_several_sizes_and_single_token_documents(layout, seq_len):
    model = dta_model("dual_triangle", "alibi", "sdpa")
    docs = documents([n for row in layout for n in row], seed=3)
    rows, index = [], 0
    for row in layout:
        rows.append(docs[index : index + len(row)])
        index += len(row)
    input_ids, position_ids, attention_mask, spans = pack(rows, seq_len)
    output = run_packed(model, input_ids, position_ids, attention_mask)
    assert_each_document_as_alone(model, docs, output, spans)


# The first row one whole document, a later row several: a batch that a look at the first row alone (or at the
# padding) would take for unpacked. Without padding anywhere, then with padding after the later row's pack.
LONE_FIRST_ROWS = [[[SEQ_LEN], [6, 1, 9, 4]], [[SEQ_LEN], [6, 1, 9]]]
# (family, attention type or preset, positions) x every backend that takes packed rows on CPU; varlen with the
# reference kernel (torch has none on CPU), and only where no additive bias is (it refuses those by name).
LONE_FIRST_ROW_MODELS = [
    *(
        ("dta", attention_type, position, backend)
        for attention_type, position in (("bidirectional", "alibi"), ("causal", "absolute"), ("dual_triangle", "rope"))
        for backend in BACKENDS
    ),
    *(("dta", attention_type, "rope", "varlen") for attention_type in TYPES),
    *(("dstg", preset, None, backend) for preset in PRESETS for backend in BACKENDS),
    *(("dstg", preset, None, "varlen") for preset in ("ap", "rope")),
]


@pytest.mark.parametrize("family,kind,position,backend", LONE_FIRST_ROW_MODELS)
def test_a_first_row_of_one_whole_document_keeps_later_rows_packed(family, kind, position, backend, monkeypatch):
    monkeypatch.setattr(varlen_module, "varlen_attn", reference_varlen_attn)
    model = dta_model(kind, position, "eager") if family == "dta" else dstg_model(kind, "eager")
    for layout in LONE_FIRST_ROWS:
        docs, (input_ids, position_ids, attention_mask, spans) = packed_case(layout, seed=len(layout[1]))
        assert spans[0] == (0, 0, SEQ_LEN) and spans[1][0] == 1
        model.set_attn_implementation(backend)
        output = run_packed(model, input_ids, position_ids, attention_mask)
        model.set_attn_implementation("eager")  # each document alone, on the plainest path
        assert_each_document_as_alone(model, docs, output, spans)


# ----------------------------------------------------------------------------------------------------------------
# gradients


def embedding_output_grad(model, input_ids, position_ids, attention_mask, loss_of):
    """d loss / d (embedding output), the first hidden state every layer builds on."""
    captured = {}

    def keep(module, inputs, output):
        state = getattr(output, "joined", output)  # DSTG's streams are views of one joined tensor
        state.retain_grad()
        captured["state"] = state

    handle = model.model.embeddings.register_forward_hook(keep)
    try:
        logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask).logits
    finally:
        handle.remove()
    loss_of(logits).backward()
    return captured["state"].grad


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["dta-dual_triangle", "dta-bidirectional", "dta-causal", "dstg", "rp"])
def test_no_gradient_crosses_documents(family, backend):
    if family.startswith("dta"):
        model = dta_model(family.split("-")[1], "alibi" if "bi" in family else "rope", backend)
    else:
        model = dstg_model(family, backend)
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case()
    weights = torch.randn(*input_ids.shape, model.config.vocab_size, dtype=torch.float64)
    for row, start, end in spans:
        grad = embedding_output_grad(
            model,
            input_ids,
            position_ids,
            attention_mask,
            lambda logits: (logits * weights)[row, start:end].sum(),  # noqa: B023 (called in this iteration)
        )
        inside = torch.zeros(input_ids.shape, dtype=torch.bool)
        inside[row, start:end] = True
        assert torch.all(grad[~inside] == 0), "a document's loss reached another document's inputs"
        assert grad[inside].abs().max() > 0


# ----------------------------------------------------------------------------------------------------------------
# transformers' collator and the MLM loss


def collator_features(docs, seed=0):
    generator = torch.Generator().manual_seed(seed)
    features = []
    for doc in docs:
        labels = torch.where(torch.rand(len(doc), generator=generator) < 0.5, doc, -100)
        features.append({"input_ids": doc.tolist(), "labels": labels.tolist()})
    return features


@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens", "both"])
@pytest.mark.parametrize("model_kind", ["dta", "dstg"])
def test_data_collator_with_flattening_output_works_unchanged(model_kind, boundaries):
    # Learned absolute positions: a relative scheme alone would not notice positions that fail to restart.
    model = dta_model("dual_triangle", "absolute", "sdpa") if model_kind == "dta" else dstg_model("dstg", "sdpa")
    docs = documents([6, 1, 9, 4], seed=2)
    collator = DataCollatorWithFlattening(
        return_position_ids=boundaries != "cu_seq_lens",
        return_flash_attn_kwargs=boundaries != "position_ids",
        return_seq_idx=boundaries == "both",
    )
    batch = collator(collator_features(docs))
    with torch.no_grad():
        output = model(**batch, output_hidden_states=True)
    spans, start = [], 0
    for doc in docs:
        spans.append((0, start, start + len(doc)))
        start += len(doc)
    assert_each_document_as_alone(model, docs, output, spans)


@pytest.mark.parametrize("model_kind", ["dta", "dstg", "dstg-sparse"])
def test_packed_mlm_loss_is_the_token_weighted_unpacked_loss(model_kind):
    if model_kind == "dta":
        model = dta_model("dual_triangle", "alibi", "sdpa")
    else:
        model = dstg_model("dstg", "sdpa")
        model.config.sparse_prediction = model_kind == "dstg-sparse"
    docs = documents([6, 3, 9, 4, 7], seed=4)
    features = collator_features(docs, seed=5)
    # The collator's labels put -100 on every document's first token; the unpacked runs get the same labels.
    batch = DataCollatorWithFlattening()(features)
    with torch.no_grad():
        packed_loss = model(**batch).loss
        total, count, start = 0.0, 0, 0
        for doc in docs:
            labels = batch["labels"][:, start : start + len(doc)]
            start += len(doc)
            labelled = int((labels != -100).sum())
            if labelled:
                total += model(input_ids=doc[None], labels=labels).loss * labelled
                count += labelled
    assert abs(packed_loss - total / count) <= 1e-6 * count  # the heads take the loss in float32


# ----------------------------------------------------------------------------------------------------------------
# varlen: the plumbing on CPU with a reference of varlen_attn's semantics


def reference_varlen_attn(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1), **unused
):
    """torch's varlen_attn, slowly: per segment, dense softmax attention; window (left, right) admits keys j with
    i - left <= j <= i + right (-1: unbounded)."""
    assert torch.equal(cu_seq_q, cu_seq_k) and cu_seq_q.dtype == torch.int32
    lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
    assert max_q == max_k == max(lengths)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    outputs = []
    for q, k, v in zip(*(x.split(lengths) for x in (query, key, value)), strict=True):
        index = torch.arange(len(q))
        offset = index[None, :] - index[:, None]  # j - i
        allowed = torch.ones(len(q), len(q), dtype=torch.bool)
        if window_size[0] >= 0:
            allowed &= offset >= -window_size[0]
        if window_size[1] >= 0:
            allowed &= offset <= window_size[1]
        scores = torch.einsum("ihd,jhd->hij", q, k) * scale
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        outputs.append(torch.einsum("hij,jhd->ihd", probs, v))
    return torch.cat(outputs)


def reference_varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, *, scale=None):
    """The torch 2.10 signature: is_causal instead of window_size."""
    return reference_varlen_attn(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=(-1, 0) if is_causal else (-1, -1)
    )


@pytest.mark.parametrize("kernel", [reference_varlen_attn, reference_varlen_attn_2_10])
@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("routing", ["channel_halves", "head_groups"])
def test_varlen_plumbing_matches_sdpa_with_a_reference_kernel(kernel, attention_type, routing, monkeypatch):
    monkeypatch.setattr(varlen_module, "varlen_attn", kernel)
    model = dta_model(attention_type, "rope", "sdpa", dual_triangle_routing=routing)
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case()
    left_padded = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
    cases = [
        dict(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask),
        dict(input_ids=input_ids[:, :10], attention_mask=left_padded),
    ]
    for inputs in cases:
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            expected = model(**inputs, output_hidden_states=True)
            model.set_attn_implementation("varlen")
            got = model(**inputs, output_hidden_states=True)
            model.set_attn_implementation("sdpa")
        for got_state, want in zip(got.hidden_states, expected.hidden_states, strict=True):
            assert (got_state[real] - want[real]).abs().max() <= TOLERANCE
        assert (got.logits[real] - expected.logits[real]).abs().max() <= TOLERANCE


def test_varlen_refuses_cpu_biases_and_dropout_with_clear_errors(monkeypatch):
    model = dta_model("dual_triangle", "rope", "varlen")
    ids = torch.randint(4, 40, (1, 5))
    if varlen_module.TORCH_VARLEN_ATTN is not None:
        with pytest.raises(ValueError, match="need a CUDA device.*'sdpa', 'eager' or 'flex_attention'"):
            model(input_ids=ids)
    monkeypatch.setattr(varlen_module, "varlen_attn", reference_varlen_attn)
    with pytest.raises(ValueError, match="varlen' has no additive attention bias"):
        dta_model("dual_triangle", "alibi", "varlen")(input_ids=ids)
    with pytest.raises(ValueError, match="attention_dropout=0.1 is not available with attn_implementation='varlen'"):
        dta_model("dual_triangle", "rope", "varlen", attention_dropout=0.1).train()(input_ids=ids)


@pytest.mark.parametrize("implementation", ["varlen", "flex_attention"])
def test_kernels_outside_autocast_get_the_autocast_dtype(implementation, monkeypatch):
    """Under bf16 autocast RoPE hands float32 q/k to attention; sdpa is cast by autocast, but FlashAttention and flex
    are not on its list, so the backend casts them itself (else varlen refuses and flex runs at float32 speed)."""
    import encoderlab.modeling.kernels.flex as flex

    seen = []

    def recording(kernel):
        def run(query, key, value, *args, **kwargs):
            seen.append((query.dtype, key.dtype, value.dtype))
            return kernel(query, key, value, *args, **kwargs)

        return run

    monkeypatch.setattr(varlen_module, "varlen_attn", recording(reference_varlen_attn))
    flex_attention = flex._flex_attention_fn
    monkeypatch.setattr(flex, "_flex_attention_fn", lambda query: recording(flex_attention(query)))
    model = dta_model("dual_triangle", "rope", implementation).float()
    ids = torch.randint(4, 40, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=torch.tensor([[1] * 9, [0, 0] + [1] * 7])).logits
    assert seen and all(dtypes == (torch.bfloat16,) * 3 for dtypes in seen)
    assert torch.isfinite(logits).all()
    with torch.no_grad():  # and nothing is cast without autocast
        model(input_ids=ids)
    assert seen[-1] == (torch.float32,) * 3


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_with_values_padded_to_the_query_width_is_exact(monkeypatch):
    """The CUDA path pads DSTG's narrower values to the q/k width; here forced on CPU (fp64, uncompiled flex,
    padded and packed rows): the logits equal sdpa's, so the padding changes nothing but the kernel's shapes."""
    import encoderlab.modeling.kernels.flex as flex

    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    widths = []

    def pads(query, value):
        widths.append((query.shape[-1], value.shape[-1]))
        return value.shape[-1] < query.shape[-1]

    monkeypatch.setattr(flex, "_pads_value_to_query_dim", pads)
    model = dstg_model("dstg", "sdpa")
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case([[7, 1, 9], [5, 12]], seed=1)
    left_padded = torch.ones_like(input_ids)
    left_padded[0, :3] = 0
    cases = [
        dict(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask),
        dict(input_ids=input_ids, attention_mask=left_padded),
    ]
    for inputs in cases:
        with torch.no_grad():
            expected = model(**inputs).logits
            model.set_attn_implementation("flex_attention")
            got = model(**inputs).logits
            model.set_attn_implementation("sdpa")
        real = inputs["attention_mask"].bool()
        assert (got[real] - expected[real]).abs().max() <= TOLERANCE
    assert widths and all(value < query for query, value in widths)  # the case the padding is for


def test_alibi_score_mod_reads_slopes_already_on_the_device():
    """A copy inside the score_mod is a new buffer, which Inductor's GPU lowering refuses (seen on an H100)."""
    score_mod = ALiBiBias(6).score_mod(6, torch.device("meta"))
    captured = [cell.cell_contents for cell in score_mod.__closure__ if torch.is_tensor(cell.cell_contents)]
    assert captured and all(t.device.type == "meta" for t in captured)


# ----------------------------------------------------------------------------------------------------------------
# sequence classification pools per document


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("model_kind", ["dta", "dstg"])
def test_sequence_classification_pools_each_document(model_kind, pooling):
    if model_kind == "dta":
        config = dta_model("dual_triangle", "rope").config
        model_class = DTABertForSequenceClassification
    else:
        config = dstg_model("dstg").config
        model_class = DSTGNeoBERTForSequenceClassification
    config.num_labels, config.classifier_pooling = 3, pooling
    model = randomised(model_class(config))
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case()
    labels = torch.tensor([0, 2, 1, 1, 0, 2, 1])
    with torch.no_grad():
        packed = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, labels=labels)
        expected = torch.cat([model(input_ids=doc[None]).logits for doc in docs])
        expected_loss = torch.nn.functional.cross_entropy(expected, labels)
    assert packed.logits.shape == (len(docs), 3)
    assert (packed.logits - expected).abs().max() <= TOLERANCE
    assert abs(packed.loss - expected_loss) <= TOLERANCE


@pytest.mark.slow
def test_compiled_flex_attention_keeps_documents_apart(monkeypatch):
    """The compiled kernel (the GPU path, here on CPU in float32) with the per-batch document BlockMask."""
    import encoderlab.modeling.kernels.flex as flex

    monkeypatch.setattr(flex, "FLEX_COMPILE", True)
    model = dta_model("dual_triangle", "rope", "flex_attention").float()
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case()
    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask).logits
        model.set_attn_implementation("eager")
        for doc, (row, start, end) in zip(docs, spans, strict=True):
            assert (logits[row, start:end] - model(input_ids=doc[None]).logits[0]).abs().max() <= 1e-4


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_sdpa_runs_of_queries_over_key_spans_match_the_dense_mask(attention_type, bias):
    """Rows longer than 256 tokens take sdpa in runs of 256 queries, each over the keys its documents reach."""
    generator = torch.Generator().manual_seed(7)
    batch, heads, length = 3, 2, 613
    position_ids = torch.zeros(batch, length, dtype=torch.long)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    for row, lengths in enumerate([[300, 1, 255, 57], [200, 213, 200], [17, 400, 100, 60, 36]]):
        start = 0
        for n in lengths:
            position_ids[row, start : start + n] = torch.arange(n)
            start += n
    attention_mask[2, 577:] = 0  # padding after the pack
    document_ids = document_ids_from_positions(position_ids)
    query, key, value = (
        torch.randn(batch, heads, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    bias_module = ALiBiBias(heads) if bias else None
    results = {}
    for implementation in ("eager", "sdpa"):
        output, _ = attend(
            query,
            key,
            value,
            attention_mask=attention_mask,
            document_ids=document_ids,
            implementation=implementation,
            attention_type=attention_type,
            bias_module=bias_module,
        )
        upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        results[implementation] = (output, torch.autograd.grad(output, (query, key, value), upstream))
    real = attention_mask.bool()
    (eager, eager_grads), (sdpa, sdpa_grads) = results["eager"], results["sdpa"]
    assert (eager - sdpa).abs().permute(0, 2, 1, 3)[real].max() <= TOLERANCE
    for eager_grad, sdpa_grad in zip(eager_grads, sdpa_grads, strict=True):
        assert (eager_grad - sdpa_grad).abs().permute(0, 2, 1, 3)[real].max() <= TOLERANCE
    # The spans narrow where every row's documents allow it.
    bounds = document_bounds(document_ids)
    assert key_spans(bounds, "lower", 256) == [(0, 256, 0, 256), (256, 512, 0, 512), (512, 613, 301, 613)]
    assert key_spans(bounds, "upper", 256) == [(0, 256, 0, 417), (256, 512, 256, 613), (512, 613, 512, 613)]
    assert key_spans(bounds, "all", 256) == [(0, 256, 0, 417), (256, 512, 0, 613), (512, 613, 301, 613)]


@pytest.mark.parametrize("preset", PRESETS)
def test_varlen_with_dstg_presets(preset, monkeypatch):
    """The baselines without a bias (ap, rope) run varlen; the RP bias of dstg and rp is refused by name."""
    monkeypatch.setattr(varlen_module, "varlen_attn", reference_varlen_attn)
    model = dstg_model(preset, "sdpa")
    docs, (input_ids, position_ids, attention_mask, spans) = packed_case([[7, 1, 9], [5, 12]], seed=1)
    inputs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask)
    with torch.no_grad():
        expected = model(**inputs).logits
        model.set_attn_implementation("varlen")
        if preset in ("dstg", "rp"):
            with pytest.raises(ValueError, match="no additive attention bias.*'flex_attention'"):
                model(**inputs)
            return
        got = model(**inputs).logits
    real = attention_mask.bool()
    assert (got[real] - expected[real]).abs().max() <= TOLERANCE


# ----------------------------------------------------------------------------------------------------------------
# sdpa on CPU: each row's runs of queries over its own documents


def row_case(layouts, pad_left):
    """Rows of packed documents (lengths per row; 0 is one padding token, on the left of the row or after the pack)
    -> attention_mask and document ids (B, L); every padding token is its own document, as position_ids that stay 0
    make it."""
    attention_mask, document_ids = [], []
    for lengths in layouts:
        valid, ids = [], []
        for length in lengths:
            valid += [length > 0] * max(length, 1)
            ids += [len(ids) and ids[-1] + 1] * max(length, 1)
        if pad_left:
            valid, ids = valid[::-1], [ids[-1] - i for i in ids[::-1]]
        attention_mask.append(valid)
        document_ids.append(ids)
    return torch.tensor(attention_mask, dtype=torch.long), torch.tensor(document_ids)


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("pad_left", [False, True])
@pytest.mark.parametrize(
    "chunk,layouts",
    [
        (8, [[13, 1, 7, 0, 0, 0], [5, 5, 5, 9], [24]]),  # 24 tokens in runs of 8, padding after the pack
        (16, [[39, 3, 1, 1, 0], [17, 16, 12], [2] * 22 + [1]]),  # 45 tokens: a last run of 13, one-token documents
        (32, [[31, 33, 0, 0, 0], [1, 64, 2]]),  # 67 tokens, a document crossing two runs
    ],
)
def test_sdpa_row_runs_match_eager_and_the_runs_over_all_rows(
    attention_type, bias, pad_left, chunk, layouts, monkeypatch
):
    """fp64, forward and gradients, at every real token: the CPU path (`sdpa_document_rows`, each row alone in runs
    of queries over its own documents' keys) equals eager and the path that runs over all rows at once."""
    import encoderlab.modeling.kernels.sdpa as sdpa

    monkeypatch.setattr(sdpa, "_ROW_QUERY_CHUNK", chunk)
    monkeypatch.setattr(sdpa, "_DOCUMENT_QUERY_CHUNK", chunk)
    generator = torch.Generator().manual_seed(chunk)
    attention_mask, document_ids = row_case(layouts, pad_left)
    batch, length = attention_mask.shape
    heads = 2
    query, key, value = (
        torch.randn(batch, heads, length, 6, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    upstream = torch.randn(batch, heads, length, 6, generator=generator, dtype=torch.float64)
    bias_module = ALiBiBias(heads) if bias else None
    results = {}
    for name, implementation, row_devices in [
        ("eager", "eager", ("cpu",)),
        ("rows", "sdpa", ("cpu",)),
        ("all rows", "sdpa", ()),
    ]:
        monkeypatch.setattr(sdpa, "_ROW_SPAN_DEVICES", row_devices)
        inputs = ATTENTION_INPUTS[implementation].build(
            attention_mask, document_ids, query.transpose(1, 2), attention_type=attention_type, num_heads=heads
        )
        output, _ = ALL_ATTENTION_FUNCTIONS[implementation](
            None, query, key, value, inputs, attention_type=attention_type, bias_module=bias_module
        )
        results[name] = (output, *torch.autograd.grad(output, (query, key, value), upstream))
        if name == "rows":  # the row path ran
            assert inputs.row_runs
    real = attention_mask.bool()
    for name in ("rows", "all rows"):
        for got, want in zip(results[name], results["eager"], strict=True):
            assert (got - want).abs().permute(0, 2, 1, 3)[real].max() <= TOLERANCE, name


def test_row_key_spans_follow_each_rows_own_documents():
    """Row 0: documents of 3, 6 and 3 tokens; row 1: one of 12. Runs of 4 queries."""
    document_ids = torch.tensor([[0] * 3 + [1] * 6 + [2] * 3, [0] * 12])
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[0, -1] = 0
    bounds = document_bounds(document_ids)
    assert row_key_spans(bounds, "lower", 4) == [
        [(0, 4, 0, 4), (4, 8, 3, 8), (8, 12, 3, 12)],
        [(0, 4, 0, 4), (4, 8, 0, 8), (8, 12, 0, 12)],
    ]
    assert row_key_spans(bounds, "upper", 4) == [
        [(0, 4, 0, 9), (4, 8, 4, 9), (8, 12, 8, 12)],
        [(0, 4, 0, 12), (4, 8, 4, 12), (8, 12, 8, 12)],
    ]
    assert row_key_spans(bounds, "all", 4) == [
        [(0, 4, 0, 9), (4, 8, 3, 9), (8, 12, 3, 12)],
        [(0, 4, 0, 12), (4, 8, 0, 12), (8, 12, 0, 12)],
    ]
    for triangle in ("lower", "upper", "all"):
        dense = allowed_mask(triangle, attention_mask.bool(), document_ids, 2, 12, "cpu")
        runs = row_runs(triangle, attention_mask.bool(), document_ids, bounds, 4, torch.float64)
        masks = runs.masks
        for row, spans in enumerate(row_key_spans(bounds, triangle, 4)):
            index, lengths = runs.key_index[row]
            assert lengths == [end - start for *_, start, end in spans]
            assert index.tolist() == [k for *_, start, end in spans for k in range(start, end)]
            for (start, end, key_start, key_end), block in zip(spans, masks[row], strict=True):
                assert torch.equal(block == 0, dense[row, 0, start:end, key_start:key_end])
                # every key the run's queries may see lies in the span
                assert dense[row, 0, start:end].sum() == dense[row, 0, start:end, key_start:key_end].sum()
