"""The DSTG analyses (encoderlab.evaluation.dstg, encoderlab experiment dstg) and the mlm_on_full_hidden ablation.

Probe targets against hand-built documents, probes on planted signals, the KL ablation and the component logits
against the model's own attention, PCA / DCT against numpy / scipy / scikit-learn, and every subcommand on tiny
checkpoints.
"""

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from figure_checks import assert_png_drawn
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from encoderlab import DSTGNeoBERTConfig, DSTGNeoBERTForMaskedLM
from encoderlab.cli import main as cli_main
from encoderlab.evaluation.dstg import documents, figures, geometry, heads, probes
from encoderlab.experiments import dstg as experiment
from encoderlab.training.pretrain import load_run_config

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------ probe targets

WORDS = "a b c d e f g h x y 3 5".split()


def word_tokenizer():
    """One token per word and per punctuation mark, [CLS] = 2, [SEP] = 3: targets can be checked by hand."""
    vocabulary = {
        token: index
        for index, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "!", "?", "@", *WORDS])
    }
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def test_segments_end_at_terminal_punctuation_and_newlines_only():
    tokenizer = word_tokenizer()
    text = "a b. c d e!\n\nf g 3.5 x @.@ y? h"
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["a", "b", ".", "c", "d", "e", "!", "f", "g", "3", ".", "5", "x", "@", ".", "@", "y", "?", "h"]
    ids, segments = documents.tokenize_with_segments([text], tokenizer)
    # "3.5" and "@.@" do not end a segment; "!" + blank line is one boundary (no empty segment).
    assert segments.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3]
    assert documents.intra_segment_positions([0, 0, 0, 1, 1, 1, 1, 2]).tolist() == pytest.approx(
        [0, 0.5, 1, 0, 1 / 3, 2 / 3, 1, 0]
    )


def test_probe_documents_are_model_length_windows_with_rebased_targets():
    tokenizer = word_tokenizer()
    texts = ["a b. c d e f g h. x", "y y y. a"]  # the first text's end ends its segment
    ids, segments = documents.tokenize_with_segments(texts, tokenizer)
    assert segments.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 4, 4][: len(ids)]
    docs = documents.build_probe_documents(texts, tokenizer, length=7)  # 5 content tokens per window
    assert len(docs) == len(ids) // 5 == 3
    first, second = docs[0], docs[1]
    assert first.input_ids == [2, *ids[:5], 3] and second.input_ids == [2, *ids[5:10], 3]
    assert first.segments.tolist() == [0, 0, 0, 1, 1]
    assert second.segments.tolist() == [0, 0, 0, 0, 0]  # rebased: the window starts inside segment 1
    targets = first.targets(7)
    assert targets["position"].tolist() == pytest.approx([1 / 7, 2 / 7, 3 / 7, 4 / 7, 5 / 7])
    assert targets["segment"].tolist() == [0, 0, 0, 1, 1]
    assert targets["intra_segment"].tolist() == pytest.approx([0, 0.5, 1, 0, 1])
    assert len(documents.build_probe_documents(texts, tokenizer, length=7, count=2)) == 2
    with pytest.raises(ValueError, match="length=2"):
        documents.build_probe_documents(texts, tokenizer, length=2)


def test_repeated_document_is_a_b_a():
    tokenizer = word_tokenizer()
    input_ids, spans = documents.repeated_document(["a b c d", "x", "e f g h"], tokenizer, part_length=3)
    part_a, part_b = tokenizer.convert_tokens_to_ids(["a", "b", "c"]), tokenizer.convert_tokens_to_ids(["e", "f", "g"])
    assert input_ids == [2, *part_a, *part_b, *part_a, 3]
    assert spans == [(1, 4), (4, 7), (7, 10)]


# ------------------------------------------------------------------------------------------------------ probes


def planted_states(num_documents=60, tokens=20, width=6, noise=0.01, seed=0):
    """Hidden states whose first two channels encode position linearly, plus noise."""
    rng = np.random.default_rng(seed)
    position = np.tile(np.arange(1, tokens + 1) / tokens, (num_documents, 1))
    states = rng.normal(size=(num_documents, tokens, width))  # channels unrelated to position
    states[..., 0] = 3 * position
    states[..., 1] = -2 * position + 1
    return states + noise * rng.normal(size=states.shape), position


def test_planted_position_gives_r2_near_one_and_shuffled_targets_near_zero():
    states, position = planted_states()
    splits = probes.document_splits(len(states), seeds=(0, 1))
    for train, test in splits:
        assert len(train) == 48 and len(test) == 12 and not set(train) & set(test)
        assert probes.probe_r2(states, position, train, test) > 0.97
        shuffled = np.random.default_rng(1).permutation(position.reshape(-1)).reshape(position.shape)
        assert abs(probes.probe_r2(states, shuffled, train, test)) < 0.05
    rows = probes.run_probes({"ap": states[None]}, {"position": position}, seeds=(0, 1), flag_last_ap=True)
    assert [row["unconstrained"] for row in rows] == [1, 1]  # the last (only) AP layer of a DSTG model
    assert probes.split_sizes(500) == (400, 100) and probes.split_sizes(50) == (40, 10)
    with pytest.raises(ValueError, match="at least 5 documents"):
        probes.split_sizes(4)


# ------------------------------------------------------------------------------------------------ head taxonomy


def test_kl_ablation_of_a_zero_component_is_zero_and_matches_a_direct_reference():
    from scipy.special import rel_entr, softmax

    generator = torch.Generator().manual_seed(0)
    shape = (2, 3, 5, 5)
    logits = {
        "semantic": torch.randn(shape, generator=generator, dtype=torch.float64),
        "ap": torch.randn(shape, generator=generator, dtype=torch.float64),
        "rp": torch.zeros(shape, dtype=torch.float64),
    }
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    kl = heads.ablation_kl(logits, key_mask)
    assert torch.equal(kl["rp"], torch.zeros(2, 3, 5, dtype=torch.float64))
    for name in ("semantic", "ap"):
        for b in range(2):
            keys = key_mask[b].numpy()
            total = sum(logits.values())[b].numpy()[..., keys]
            expected = rel_entr(softmax(total, -1), softmax(total - logits[name][b].numpy()[..., keys], -1)).sum(-1)
            assert np.allclose(kl[name][b].numpy(), expected, atol=1e-12)
            assert (kl[name][b] > 0).all()
    # whatever a padding key holds does not change the scores
    logits["ap"][1, ..., 3:] = 1e3
    assert torch.allclose(heads.ablation_kl(logits, key_mask)["ap"][1], kl["ap"][1])
    shares = heads.normalise(np.array([[[1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]]))
    assert shares.tolist() == [[[0.25, 0.75, 0.0], [0.0, 0.0, 0.0]]]
    assert np.allclose(figures.ternary_xy([[1, 0, 0], [0, 1, 0], [0, 0, 1]]), [[0, 1, 0.5], [0, 0, np.sqrt(3) / 2]])


def tiny_dstg(**overrides):
    fields = dict(
        preset="dstg",
        vocab_size=64,
        hidden_size=32,
        ap_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=24,
        cls_token_id=2,
        sep_token_id=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=10,
    )
    fields.update(overrides)
    model = DSTGNeoBERTForMaskedLM(DSTGNeoBERTConfig(**fields))
    with torch.no_grad():  # the RP tables and special scalars start at zero
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 1.0 if "relative" in name or "special" in name else 0.3)
    return model.double().eval()


@pytest.mark.parametrize("side", ["right", "left"])
def test_component_logits_sum_to_the_attention_forward_uses(side):
    """softmax(semantic + AP + RP) with the padding mask is the eager attention of the model, layer by layer."""
    model = tiny_dstg()
    model.model.set_attn_implementation("eager")
    rows = [[2, 10, 11, 12, 3, 13, 14, 3], [2, 20, 21, 3], [2, 30, 31, 32, 33, 34, 35, 36, 37, 3]]
    length = max(map(len, rows))
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for b, row in enumerate(rows):
        span = slice(length - len(row), None) if side == "left" else slice(0, len(row))
        input_ids[b, span], mask[b, span] = torch.tensor(row), 1
    with torch.no_grad():
        attentions = model.model(input_ids, attention_mask=mask, output_attentions=True).attentions
    per_layer = heads.layer_components(model.model, input_ids, mask)
    for logits, attention in zip(per_layer, attentions, strict=True):
        assert set(logits) == {"semantic", "ap", "rp"}
        probabilities = heads.masked_log_softmax(sum(logits.values()), mask.bool()).exp()
        real = mask.bool()[:, None, :, None].expand_as(attention)  # padding queries are not compared
        assert torch.allclose(probabilities[real], attention[real], atol=1e-12)
        special = torch.isin(input_ids, torch.tensor([2, 3]))
        assert (logits["ap"][special[:, None, :, None].expand_as(logits["ap"])] == 0).all()


def test_head_scores_rank_the_component_that_dominates():
    """Scaling up one stream's projections makes its component the largest KL share of every head."""
    docs = [documents.ProbeDocument([2, *range(10, 30), 3], np.zeros(20, dtype=np.int64))] * 2
    for name, module in (("semantic", "semantic_qkv"), ("ap", "ap_qkv")):
        scaled = tiny_dstg()
        with torch.no_grad():
            for layer in scaled.model.layers:
                getattr(layer.attention, module).weight.mul_(8.0)  # its logits grow 64-fold
        rows = heads.score_rows(heads.head_scores(scaled.model, docs))
        assert len(rows) == 4 and {row["group"] for row in rows} == {name}
        assert all(abs(sum(row[f"share_{c}"] for c in heads.COMPONENTS) - 1) < 1e-9 for row in rows)


# -------------------------------------------------------------------------------------------------- geometry

AMPLITUDES = np.array([3.0, 2.0, 1.0, 2.5, 1.5, 0.5])
"""cos of 1, 2, 7 periods over the table, then sin of the same: distinct amplitudes, so no two PCs tie."""


def sinusoidal_table(positions=128):
    angle = 2 * np.pi * np.arange(positions)[:, None] * np.array([1, 2, 7]) / positions
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1) * AMPLITUDES


def test_pca_and_dct_match_numpy_scipy_and_sklearn_on_a_sinusoidal_table():
    from scipy.fft import dct
    from sklearn.decomposition import PCA

    table = sinusoidal_table()
    ratios, projected = geometry.pca(table)
    reference = PCA().fit(table)
    assert np.allclose(ratios, reference.explained_variance_ratio_, atol=1e-10)
    transformed = reference.transform(table)
    for k in range(4):  # components agree up to sign
        sign = np.sign(projected[:, k] @ transformed[:, k])
        assert np.abs(projected[:, k] - sign * transformed[:, k]).max() < 1e-8
    # DCT-II: the orthonormal transform written out, and a pure cosine of bin k has all its power in bin k
    n = 64
    signal = np.random.default_rng(0).normal(size=n)
    basis = np.cos(np.pi * np.outer(np.arange(n), 2 * np.arange(n) + 1) / (2 * n)) * np.sqrt(2 / n)
    basis[0] /= np.sqrt(2)
    assert np.allclose(geometry.dct_power(signal), (basis @ signal) ** 2 / ((basis @ signal) ** 2).sum())
    assert np.allclose(geometry.dct_power(signal), dct(signal, norm="ortho") ** 2 / (signal**2).sum())
    pure = np.cos(np.pi * 3 * (2 * np.arange(n) + 1) / (2 * n))
    assert geometry.dct_power(pure)[3] == pytest.approx(1.0)
    # the table's leading components are its lowest frequencies: low-band power near 1 for the first two
    summary = geometry.table_geometry(table)
    # whole periods: each column has variance amplitude^2 / 2 and the columns are orthogonal
    variances = np.sort(AMPLITUDES**2)[::-1]
    assert np.allclose(summary["cumulative_variance"], np.cumsum(variances) / variances.sum())
    assert min(summary["low_frequency_share"][:2]) > 0.9  # the one-period cos and sin
    assert summary["low_frequency_share"][2] < 0.1  # 2 periods of cos(2x) peak at DCT bin 4


# -------------------------------------------------------------------------------------- mlm_on_full_hidden


def test_mlm_on_full_hidden_reads_the_ap_slice_and_round_trips(tmp_path):
    on = tiny_dstg(mlm_on_full_hidden=True).float().train()
    off = tiny_dstg().float().train()
    assert on.lm_head.decoder.in_features == 32 and off.lm_head.decoder.in_features == 24
    input_ids = torch.tensor([[2, 10, 11, 12, 13, 3]])
    labels = torch.tensor([[-100, 10, 11, 12, 13, -100]])
    for model, reaches_ap in ((on, True), (off, False)):
        model(input_ids, labels=labels).loss.backward()
        grad = model.model.layers[-1].mlp.ap_down.weight.grad  # writes only into the last AP output
        assert (grad is not None and grad.abs().max() > 0) == reaches_ap
    on.eval().save_pretrained(tmp_path)
    loaded = DSTGNeoBERTForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.mlm_on_full_hidden is True
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids).logits, on(input_ids).logits)
    assert DSTGNeoBERTConfig().mlm_on_full_hidden is False


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(mlm_on_full_hidden="yes"), "mlm_on_full_hidden"),
        (dict(preset="ap", mlm_on_full_hidden=True), "mlm_on_full_hidden=True only applies to preset='dstg'"),
        (dict(mlm_on_full_hidden=True, tie_word_embeddings=True), "needs tie_word_embeddings=False"),
    ],
)
def test_mlm_on_full_hidden_bad_values(fields, message):
    with pytest.raises(ValueError, match=message):
        DSTGNeoBERTConfig(**fields).validate()


# -------------------------------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny dstg / rope checkpoints and a tiny BERT, with a WordPiece tokenizer trained on the embedded text."""
    from transformers import BertConfig, BertModel

    from encoderlab.tokenization import train_wordpiece_tokenizer

    root = tmp_path_factory.mktemp("dstg_checkpoints")
    tokenizer = train_wordpiece_tokenizer(
        documents.load_texts("embedded", limit=40), vocab_size=300, model_max_length=32
    )
    paths = {}
    for preset, sizes in (("dstg", dict(hidden_size=24, ap_size=8)), ("rope", dict(hidden_size=16))):
        config = DSTGNeoBERTConfig(
            preset=preset,
            vocab_size=len(tokenizer),
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            **sizes,
        )
        torch.manual_seed(0)
        paths[preset] = root / preset
        DSTGNeoBERTForMaskedLM(config).save_pretrained(paths[preset])
        tokenizer.save_pretrained(paths[preset])
    bert = BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=40,
        )
    )
    paths["bert"] = root / "bert"
    bert.save_pretrained(paths["bert"])
    tokenizer.save_pretrained(paths["bert"])
    return paths


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_subcommand_on_a_tiny_checkpoint(checkpoints, tmp_path, capsys):
    dstg = str(checkpoints["dstg"])
    common = ["--model", dstg, "--text", "embedded"]
    assert (
        cli_main(
            [
                "analyze",
                "dstg-probes",
                *common,
                "--documents",
                "20",
                "--seeds",
                "0",
                "1",
                "--out-dir",
                str(tmp_path / "probes"),
            ]
        )
        == 0
    )
    rows = read_csv(tmp_path / "probes" / "probes.csv")
    # 3 spaces x 2 layers x 3 targets x 2 seeds; the last AP layer is flagged
    assert len(rows) == 36 and {row["space"] for row in rows} == {"full", "ap", "semantic"}
    assert {(row["space"], row["layer"]) for row in rows if row["unconstrained"] == "1"} == {("ap", "1")}
    assert all(row["documents"] == "20" and row["length"] == "32" for row in rows)
    assert cli_main(["analyze", "dstg-heads", *common, "--documents", "4", "--out-dir", str(tmp_path / "heads")]) == 0
    head_rows = read_csv(tmp_path / "heads" / "heads.csv")
    assert len(head_rows) == 4 and all(
        abs(sum(float(row[f"share_{c}"]) for c in heads.COMPONENTS) - 1) < 1e-6 for row in head_rows
    )
    assert cli_main(["analyze", "dstg-geometry", *common, "--out-dir", str(tmp_path / "geometry")]) == 0
    assert len(read_csv(tmp_path / "geometry" / "ap_table.csv")) == 8  # one row per AP channel
    assert cli_main(["analyze", "dstg-components", *common, "--out-dir", str(tmp_path / "components")]) == 0
    assert len(read_csv(tmp_path / "components" / "components.csv")) == 4 * 2  # 4 maps x 2 heads
    for path in (
        "probes/probes.png",
        "heads/heads.png",
        "geometry/ap_table.png",
        "geometry/ap_states.png",
        "components/components.png",
    ):
        assert_png_drawn(tmp_path / path)
    # a BERT folder: its learned position table (40 positions x 16 channels)
    assert (
        cli_main(
            [
                "analyze",
                "dstg-geometry",
                "--model",
                str(checkpoints["bert"]),
                "--text",
                "embedded",
                "--out-dir",
                str(tmp_path / "bert"),
            ]
        )
        == 0
    )
    assert len(read_csv(tmp_path / "bert" / "ap_table.csv")) == 16
    # analyses that need separate components, or a position table, refuse a rope model by name
    capsys.readouterr()
    rope = ["--model", str(checkpoints["rope"]), "--text", "embedded", "--out-dir", str(tmp_path / "rope")]
    assert cli_main(["analyze", "dstg-heads", *rope]) == 1
    assert "preset='dstg'" in capsys.readouterr().err
    assert cli_main(["analyze", "dstg-geometry", *rope]) == 1
    assert "0 learned position tables" in capsys.readouterr().err
    assert cli_main(["analyze", "dstg-probes", *rope, "--documents", "10", "--seeds", "0"]) == 0


@pytest.mark.parametrize(
    "argv,error",
    [
        (["dstg-probes", "--documents", "4"], "--documents=4 must be >= 5"),
        (["dstg-probes", "--length", "2"], "--length=2 must be >= 3"),
        (["dstg-probes", "--alpha", "0"], "--alpha=0.0 must be > 0"),
        (["dstg-probes", "--batch-size", "0"], "--batch-size=0 must be >= 1"),
        (["dstg-heads", "--documents", "0"], "--documents=0 must be >= 1"),
        (["dstg-heads", "--batch-size", "0"], "--batch-size=0 must be >= 1"),
        (["dstg-components", "--part-length", "0"], "--part-length=0 must be >= 1"),
    ],
)
def test_subcommands_refuse_bad_values_before_loading_the_model(argv, error, tmp_path, capsys):
    """The model folder does not exist: the option's own error comes first, naming the option and its value."""
    assert cli_main(["analyze", *argv, "--model", str(tmp_path / "no-model"), "--out-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"encoderlab: error: {error} (--debug shows the traceback)"]


# ------------------------------------------------------------------------------------------------ experiment


def test_arms_share_the_run_and_baselines_get_the_semantic_width():
    from encoderlab.configuration.dstg import PRESETS
    from encoderlab.experiments.dstg_cli import PRESETS as CLI_PRESETS

    assert CLI_PRESETS == PRESETS  # the CLI module keeps its own copy to stay free of transformers
    base = load_run_config("dstg_cpu")
    runs = {name: experiment.arm_config(base, experiment.Arm(name, 3), Path("out")) for name in experiment.ARMS}
    dstg_config = runs["dstg"].model.config
    assert dstg_config["hidden_size"] - dstg_config["ap_size"] == runs["ap"].model.config["hidden_size"]
    for name in ("ap", "rp", "rope"):
        assert runs[name].model.config["preset"] == name and runs[name].model.config["ap_size"] is None
    assert runs[experiment.ABLATION].model.config["mlm_on_full_hidden"] is True
    assert runs[experiment.ABLATION].model.config["tie_word_embeddings"] is False
    for run in runs.values():
        assert run.train.seed == 3 and run.train.drope_fraction is None
        assert dataclasses.replace(run, model=base.model, train=base.train, output_dir=base.output_dir) == base
    assert runs["rp"].output_dir == str(Path("out") / "runs" / "rp-s3")


def test_summary_tables_have_the_paper_layout():
    probe_rows = []
    for arm, spaces in (("rope", ["full"]), ("rp", ["full"]), ("ap", ["full"]), ("dstg", ["full", "ap", "semantic"])):
        for space in spaces:
            for layer in range(6):
                for seed in (0, 1):
                    probe_rows.append(
                        {
                            "arm": arm,
                            "space": space,
                            "layer": layer,
                            "target": "position",
                            "seed": seed,
                            "r2": 0.5 + 0.1 * seed,
                            "unconstrained": int(arm == "dstg" and space == "ap" and layer == 5),
                        }
                    )
    lines = experiment.probe_table(experiment.probe_means(probe_rows), "position")
    assert lines[0].startswith("| Table 2 | layer 0") and len(lines) == 2 + 6
    dstg_row = next(line for line in lines if line.startswith("| DSTG |"))
    assert dstg_row.count("(0.") == 5 and dstg_row.endswith("- (-) |")
    assert "0.55 ± 0.07 (0.99)" in dstg_row
    sem_row = next(line for line in lines if "sem. only" in line)
    assert sem_row.endswith("0.55 ± 0.07 (0.18) |")


def test_collect_keeps_the_training_seed_apart_from_the_probe_seed(tmp_path):
    runs_rows = [{"arm": "dstg", "seed": training_seed} for training_seed in (0, 1)]
    for training_seed in (0, 1):
        folder = tmp_path / "analysis" / f"dstg-s{training_seed}"
        folder.mkdir(parents=True)
        (folder / "probes.csv").write_text(
            "space,layer,target,seed,r2\n"
            + "".join(f"ap,0,position,{probe},{training_seed + probe / 10}\n" for probe in (0, 1, 2))
        )
        (folder / "ap_table.csv").write_text(
            "component,variance_ratio,cumulative_variance,low_frequency_share\n"
            f"1,0.4,0.4,{0.9 - training_seed / 10}\n2,0.2,{0.6 + training_seed / 10},0.5\n3,0.1,0.8,0.1\n"
        )
    collected = experiment.collect(tmp_path, runs_rows)
    probes = read_csv(tmp_path / "dstg_probes.csv")
    assert [(row["seed"], row["probe_seed"]) for row in probes] == [
        (str(training), str(probe)) for training in (0, 1) for probe in (0, 1, 2)
    ]
    assert [float(row["r2"]) for row in probes if row["seed"] == "1"] == [1.0, 1.1, 1.2]
    two, low = experiment.geometry_summary(collected["geometry"])["dstg"]
    assert two == pytest.approx(0.65) and low == pytest.approx([0.85, 0.5, 0.1])  # means over training seeds
