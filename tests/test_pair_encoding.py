"""``classifier_pair_encoding="separate"``: a pair tokenised as ``[CLS] a [SEP] b [SEP]`` gives, in every family,
attention type and position scheme, exactly the logits of a slow reference that runs the encoder on ``[CLS] a [SEP]``
and on ``b [SEP]`` alone, mean-pools each, and feeds ``[u, v, |u - v|, u * v]`` to the head: with right and left
padding, odd lengths, packed rows of pairs and `DataCollatorWithFlattening` boundaries (fp64). Bad settings and
inputs get errors naming the field."""

import pytest
import torch
from test_packing_model import randomised
from transformers import DataCollatorWithFlattening

from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForSequenceClassification
from encoderlab.modeling.dta import DTABertForSequenceClassification
from encoderlab.modeling.homa import HOMAForSequenceClassification
from encoderlab.modeling.pairs import pair_segments

pytestmark = pytest.mark.usefixtures("one_thread")

CLS, SEP, PAD = 1, 2, 0
SEPARATE = dict(classifier_pair_encoding="separate", classifier_pooling="mean", sep_token_id=SEP, num_labels=3)
# (length of a, length of b) per pair, words only: odd lengths, a one-word text, unequal texts.
PAIR_LENGTHS = [(3, 5), (1, 2), (6, 1), (4, 4)]
TOLERANCE = 1e-10

DTA_ARMS = [
    ("dual_triangle", "none"),
    ("dual_triangle", "rope"),
    ("bidirectional", "rope"),
    ("bidirectional", "absolute"),
    ("causal", "alibi"),
]
DSTG_PRESETS = ["dstg", "rp"]
HOMA_TYPES = ["pairwise", "homa"]


def dta_classifier(attention_type="dual_triangle", position="none", **overrides):
    config = DTABertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        attention_type=attention_type,
        position_embedding_type=position,
        **{**SEPARATE, **overrides},
    )
    return randomised(DTABertForSequenceClassification(config))


def dstg_classifier(preset):
    sizes = dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=24)
    config = DSTGNeoBERTConfig(
        preset=preset,
        vocab_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        cls_token_id=CLS,
        pad_token_id=PAD,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=6,
        **sizes,
        **SEPARATE,
    )
    return randomised(DSTGNeoBERTForSequenceClassification(config))


def homa_classifier(attention_type):
    config = HOMAConfig(
        vocab_size=40,
        hidden_size=16,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        u_rank=4,
        fusion_hidden_size=8,
        max_position_embeddings=64,
        attention_type=attention_type,
        block_size=4,
        block_stride=2,
        triadic_window=3,
        **SEPARATE,
    )
    return randomised(HOMAForSequenceClassification(config))


def classifiers():
    for attention_type, position in DTA_ARMS:
        yield pytest.param(
            lambda t=attention_type, p=position: dta_classifier(t, p), id=f"dta-{attention_type}-{position}"
        )
    for preset in DSTG_PRESETS:
        yield pytest.param(lambda p=preset: dstg_classifier(p), id=f"dstg-{preset}")
    for attention_type in HOMA_TYPES:
        yield pytest.param(lambda t=attention_type: homa_classifier(t), id=f"homa-{attention_type}")


def pairs(seed=0, second_cls=True):
    """[(a, b)]: a = [CLS] words [SEP]; b = [CLS] words [SEP] as encoderlab's separate pair template writes it
    (`encoderlab.tokenization.pairs`), or words [SEP] as the usual pair template does (`second_cls=False`)."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for length_a, length_b in PAIR_LENGTHS:
        words_a, words_b = (torch.randint(4, 40, (n,), generator=generator) for n in (length_a, length_b))
        found.append(
            (
                torch.cat([torch.tensor([CLS]), words_a, torch.tensor([SEP])]),
                torch.cat([torch.tensor([CLS] if second_cls else []).long(), words_b, torch.tensor([SEP])]),
            )
        )
    return found


def padded(pair_list, side):
    """input_ids, attention_mask (N, L) of joined pairs, padded on `side`."""
    joined = [torch.cat(pair) for pair in pair_list]
    width = max(len(ids) for ids in joined) + 1  # one pad even on the longest row
    input_ids = torch.full((len(joined), width), PAD)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(joined):
        span = slice(0, len(ids)) if side == "right" else slice(width - len(ids), width)
        input_ids[row, span], attention_mask[row, span] = ids, 1
    return input_ids, attention_mask


def packed(pair_list, rows=2):
    """Pairs packed into `rows` rows (position_ids restarting at each pair), padding after each pack."""
    groups = [pair_list[row::rows] for row in range(rows)]
    joined = [[torch.cat(pair) for pair in group] for group in groups]
    width = max(sum(len(ids) for ids in group) for group in joined) + 2
    input_ids = torch.full((rows, width), PAD)
    position_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, group in enumerate(joined):
        flat = torch.cat(group)
        input_ids[row, : len(flat)], attention_mask[row, : len(flat)] = flat, 1
        position_ids[row, : len(flat)] = torch.cat([torch.arange(len(ids)) for ids in group])
    order = [pair for group in groups for pair in group]
    return input_ids, position_ids, attention_mask, order


@torch.no_grad()
def reference_logits(model, pair_list):
    """Each text through the encoder alone, mean over its tokens, then the head on [u, v, |u - v|, u * v]."""

    def encode(ids):
        outputs = model.run_base_model(ids[None], None, None, None, {})
        return model.sequence_features(outputs)[0].mean(dim=0)

    features = []
    for a, b in pair_list:
        u, v = encode(a), encode(b)
        features.append(torch.cat([u, v, (u - v).abs(), u * v]))
    return model.classifier(torch.stack(features))


@pytest.mark.parametrize("make_model", classifiers())
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("second_cls", [True, False], ids=["separate-template", "usual-template"])
def test_padded_pairs_match_each_text_encoded_alone(make_model, side, second_cls):
    model = make_model()
    pair_list = pairs(second_cls=second_cls)
    input_ids, attention_mask = padded(pair_list, side)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert logits.shape == (len(pair_list), 3)
    assert (logits - reference_logits(model, pair_list)).abs().max() <= TOLERANCE


@pytest.mark.parametrize("make_model", classifiers())
def test_packed_pairs_match_each_text_encoded_alone(make_model):
    model = make_model()
    input_ids, position_ids, attention_mask, order = packed(pairs(seed=1))
    labels = torch.tensor([0, 2, 1, 1])
    with torch.no_grad():
        out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, labels=labels)
        expected = reference_logits(model, order)
    assert (out.logits - expected).abs().max() <= TOLERANCE
    assert abs(out.loss - torch.nn.functional.cross_entropy(expected, labels)) <= TOLERANCE


def test_flattening_collator_output_matches_each_text_encoded_alone():
    """transformers' padding-free collator: one row, cu_seq_lens marking the pairs."""
    model = dta_classifier("dual_triangle", "rope")
    pair_list = pairs(seed=2)
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
        [{"input_ids": torch.cat(pair).tolist()} for pair in pair_list]
    )
    batch.pop("labels", None)
    with torch.no_grad():
        logits = model(**batch).logits
    assert (logits - reference_logits(model, pair_list)).abs().max() <= TOLERANCE


def test_segments_restart_positions_at_the_second_text():
    input_ids = torch.tensor([[PAD, PAD, CLS, 7, SEP, 8, 9, SEP], [CLS, 7, SEP, 8, SEP, CLS, 5, SEP]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    document_ids = torch.tensor([[0] * 8, [0, 0, 0, 0, 0, 1, 1, 1]])
    segment_ids, position_ids = pair_segments(input_ids, attention_mask, document_ids, SEP)
    assert segment_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 2, 2, 2]]
    assert position_ids[:, 2:].tolist() == [[0, 1, 2, 0, 1, 2], [2, 0, 1, 0, 1, 2]]
    assert position_ids[1, :2].tolist() == [0, 1]


def test_joint_and_separate_heads_differ_only_in_width():
    joint = DTABertForSequenceClassification(
        DTABertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_labels=3)
    )
    separate = dta_classifier()
    assert joint.classifier.dense.in_features == 16
    assert separate.classifier.dense.in_features == 64


def test_saved_model_keeps_the_encoding_and_gives_the_same_logits(tmp_path):
    model = dta_classifier().float()
    model.save_pretrained(tmp_path)
    reloaded = DTABertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert reloaded.config.classifier_pair_encoding == "separate"
    input_ids, attention_mask = padded(pairs(), "right")
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=input_ids, attention_mask=attention_mask).logits,
            model(input_ids=input_ids, attention_mask=attention_mask).logits,
        )


def test_a_single_text_in_the_batch_is_refused():
    model = dta_classifier()
    input_ids, attention_mask = padded(pairs(), "right")
    input_ids[1] = torch.tensor([CLS, 5, 6, SEP] + [PAD] * (input_ids.shape[1] - 4))
    attention_mask[1] = (input_ids[1] != PAD).long()
    with pytest.raises(ValueError, match="two texts per example.*4 examples but 7 texts"):
        model(input_ids=input_ids, attention_mask=attention_mask)


def test_inputs_embeds_alone_is_refused():
    model = dta_classifier()
    with pytest.raises(ValueError, match="inputs_embeds alone cannot be split"):
        model(inputs_embeds=torch.zeros(1, 4, 16, dtype=torch.float64))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(classifier_pair_encoding="siamese"), r"classifier_pair_encoding.*'siamese'.*joint.*separate"),
        (dict(classifier_pooling="cls"), r"classifier_pooling='cls'; allowed with it: 'mean'"),
        (dict(sep_token_id=None), r"sep_token_id is None"),
    ],
)
def test_bad_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        DTABertConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, **{**SEPARATE, **overrides}
        )


def test_tracing_is_refused_with_the_reason(monkeypatch):
    """torch.compile / torch.export cannot count a batch's texts; the joint encoding is the one to export."""
    import encoderlab.modeling.heads as heads

    monkeypatch.setattr(heads, "is_tracing", lambda: True)
    input_ids, attention_mask = padded(pairs(), "right")
    with pytest.raises(NotImplementedError, match="cannot trace; use 'joint' for export"):
        dta_classifier()(input_ids=input_ids, attention_mask=attention_mask)
