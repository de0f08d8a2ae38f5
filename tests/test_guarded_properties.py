"""Properties that once had no test: attention dropout only while training, a float32 softmax in half-precision
eager attention, finite rows where every key is padding, flex_attention's refusal of attention dropout, sdpa as the
automatic kernel on every device that is not CUDA, local model paths told from Hub ids, the sign of the margin over
the SQuAD baseline, and the HOMA paper's Table 2 as the paper prints it.

Each test is checked by putting its bug in (a monkeypatched kernel, guard or check) and watching it fail. Models are
tested through their public behaviour (``attn_implementation`` and a forward); the few internal functions the tests
call are imported in one place below.
"""

import csv
import re
from pathlib import Path

import pytest
import torch

from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.experiments.homa.arms import COLUMNS as HOMA_COLUMNS
from encoderlab.experiments.homa.paper import PAPER_TABLE2
from encoderlab.hub_cards.card import build_model_card
from encoderlab.metrics import load_metric

# Internal functions, imported here only (their modules may move).
from encoderlab.modeling.attention import (
    attend,  # one attention call without a model
    choose_attention,  # the kernel a run trains with when none is named
)
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM
from encoderlab.modeling.dta import DTABertForMaskedLM
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.modeling.positions import ALiBiBias, T5RelativeBias
from encoderlab.run_files import RunRecord
from encoderlab.training.finetune.model_path import check_model_path  # --model: local folder or Hub id
from encoderlab.training.finetune.report import format_results  # the summary a fine-tuning run prints
from encoderlab.training.finetune.squad import no_answer_baseline  # SQuAD's trivial rule, scored

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
HOMA_PAPER = SEEDS / "homa_higher_order_attention_paper.txt"
HOMA_TABLE2_CSV = Path(__file__).parent / "fixtures" / "homa_paper_table2.csv"

VOCAB, CLS, SEP = 40, 1, 2


# ----------------------------------------------------------------------------------------------------------------
# small models of each family


def family_model(family, implementation, attention_dropout=0.0, **overrides):
    """A two-layer model of ``family`` ("dta", "homa", "dstg") with seeded weights and no hidden dropout, so that
    attention dropout is the only randomness of a forward (but DSTG's training-time position shift)."""
    torch.manual_seed(0)
    sizes = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        hidden_dropout_prob=0.0,
        attention_dropout=attention_dropout,
        attn_implementation=implementation,
    )
    sizes["max_position_embeddings"] = overrides.pop("max_position_embeddings", 64)
    if family == "dta":
        return DTABertForMaskedLM(DTABertConfig(hidden_size=16, **sizes, **overrides))
    if family == "homa":
        return HOMAForMaskedLM(
            HOMAConfig(hidden_size=16, block_size=6, block_stride=3, linformer_k=5, **sizes, **overrides)
        )
    preset = overrides.pop("preset", "dstg")
    return DSTGNeoBERTForMaskedLM(
        DSTGNeoBERTConfig(
            hidden_size=24,
            preset=preset,
            ap_size=8 if preset == "dstg" else None,
            cls_token_id=CLS,
            sep_token_id=SEP,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=6,
            **sizes,
            **overrides,
        )
    )


# family, overrides: the attention paths of each family that take the implementation's kernel or their own
FAMILY_CASES = {
    "dta-bidirectional": ("dta", dict(attention_type="bidirectional")),
    "dta-causal-alibi": ("dta", dict(attention_type="causal", position_embedding_type="alibi")),
    "dta-dual-triangle": ("dta", dict(attention_type="dual_triangle")),
    "homa-pairwise": ("homa", dict(attention_type="pairwise")),
    "homa-linformer": ("homa", dict(attention_type="linformer", position_embedding_type="absolute")),
    "homa-homa": ("homa", dict(attention_type="homa")),
    "dstg-dstg": ("dstg", dict(preset="dstg")),
    "dstg-rp": ("dstg", dict(preset="rp")),
}


def batch(rows=2, seq_len=13, fully_padded_row=False):
    """Ids that start with [CLS], the second row right-padded, and with ``fully_padded_row`` a last row whose
    every token is padding."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (rows + fully_padded_row, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, seq_len - 4 :] = 0
    if fully_padded_row:
        attention_mask[-1] = 0
    input_ids[:, 0] = CLS
    return input_ids, attention_mask


# ----------------------------------------------------------------------------------------------------------------
# (1) attention dropout: off in eval in every backend, on in train


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_attention_dropout_is_off_in_eval_and_on_in_train(case, implementation, uncompiled_flex):
    family, overrides = FAMILY_CASES[case]
    dropping = family_model(family, implementation, attention_dropout=0.5, **overrides)
    plain = family_model(family, implementation, attention_dropout=0.0, **overrides)
    plain.load_state_dict(dropping.state_dict())
    input_ids, attention_mask = batch()
    real = attention_mask.bool()
    if dropping.config.attention_blocker(implementation) is not None:  # HOMA's blocks and Linformer: eager, sdpa
        with pytest.raises(ValueError, match=f"attn_implementation='{implementation}' cannot run this model"):
            dropping(input_ids=input_ids, attention_mask=attention_mask)
        return

    dropping.eval(), plain.eval()
    with torch.no_grad():  # flex_attention runs its own kernel on CPU only without gradients
        first, second = (dropping(input_ids=input_ids, attention_mask=attention_mask).logits for _ in range(2))
        without = plain(input_ids=input_ids, attention_mask=attention_mask).logits
    assert torch.equal(first, second), "two eval forwards differ: attention dropout is on in eval"
    torch.testing.assert_close(
        first[real],
        without[real],
        rtol=0,
        atol=1e-6,
        msg="eval with attention_dropout=0.5 differs from eval without it",
    )

    if implementation == "flex_attention":
        return  # training with attention dropout is refused there (test_flex_attention_refuses_attention_dropout...)
    dropping.train(), plain.train()
    outputs = {}
    for name, model in (("dropping", dropping), ("plain", plain), ("plain again", plain)):
        torch.manual_seed(3)  # the same draws for everything else that is random in training (DSTG's shift)
        outputs[name] = model(input_ids=input_ids, attention_mask=attention_mask).logits[real]
    assert torch.equal(outputs["plain"], outputs["plain again"]), "training forwards without dropout differ"
    assert not torch.allclose(outputs["dropping"], outputs["plain"]), (
        "attention_dropout=0.5 changes nothing in training"
    )


# ----------------------------------------------------------------------------------------------------------------
# (2) half precision: the eager softmax runs in float32


def bf16_exact_case(seq_len, generator):
    """q, k (1, 4, L, 16) of small integers (every score, with scale 1, an integer below 256: exact in bf16, so the
    bf16 and fp32 kernels see the same logits) and v in [-1, 1], all bf16. Heads 0 and 1 have large logits (up to
    +-144, far past exp's float range without the max subtracted); heads 2 and 3 flat ones (a row of 0 and a row
    within a few units), whose sums over L keys a bf16 accumulator could not hold past 256 terms."""
    query = torch.randint(-3, 4, (1, 4, seq_len, 16), generator=generator).float()
    key = torch.randint(-3, 4, (1, 4, seq_len, 16), generator=generator).float()
    query[:, 2] = 0
    query[:, 3] = query[:, 3].clamp(-1, 1) * (torch.arange(16) < 2)
    key[:, 3] = key[:, 3].clamp(-1, 1)
    value = torch.rand(1, 4, seq_len, 16, generator=generator) * 2 - 1
    return tuple(t.bfloat16() for t in (query, key, value))


@pytest.mark.parametrize("attention_type", ["bidirectional", "dual_triangle"])
@pytest.mark.parametrize("seq_len", [33, 1024])
def test_bf16_eager_softmax_matches_an_fp32_reference_on_large_and_flat_logits(attention_type, seq_len):
    """bf16 keeps 8 significant bits: a float32 softmax whose probabilities are rounded once to bf16, and their
    product with v rounded once more, stays within about 2**-8 of the output scale (measured: 0.0043 at most); the
    tolerance is 4x that. A softmax whose arithmetic ran in bf16 loses the sums of long flat rows (past 256 terms,
    each term near 1 rounds away) and misses by 0.17."""
    generator = torch.Generator().manual_seed(seq_len)
    query, key, value = bf16_exact_case(seq_len, generator)
    mask = torch.ones(1, seq_len, dtype=torch.long)
    mask[:, -5:] = 0
    with torch.no_grad():
        got, _ = attend(
            query, key, value, implementation="eager", attention_mask=mask, attention_type=attention_type, scale=1.0
        )
        expected, _ = attend(
            query.float(),
            key.float(),
            value.float(),
            implementation="eager",
            attention_mask=mask,
            attention_type=attention_type,
            scale=1.0,
        )
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    error = (got.float() - expected).abs().max().item()
    assert error <= 2**-6 * expected.abs().max().item(), f"bf16 eager output off the fp32 reference by {error:.3g}"


@pytest.mark.parametrize("case", ["dta-dual-triangle", "homa-pairwise", "dstg-dstg"])
def test_bf16_eager_model_on_long_rows_stays_near_fp32(case):
    """A whole model in bf16 (the DTA paper's recipe) through eager attention over 600 tokens stays within
    test_precision's 3% of the output scale of its fp32 copy (measured: 1.2% at most; a softmax with bf16 arithmetic
    misses by 5.7% to 10%)."""
    family, overrides = FAMILY_CASES[case]
    model = family_model(family, "eager", max_position_embeddings=640, **overrides).eval()
    reference = family_model(family, "eager", max_position_embeddings=640, **overrides).eval()
    reference.load_state_dict({name: t.bfloat16().float() for name, t in model.state_dict().items()})
    model = model.bfloat16()
    input_ids, attention_mask = batch(seq_len=600)
    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    error = (got[real] - expected[real]).abs().max().item()
    assert error <= 0.03 * expected[real].abs().max().item(), f"bf16 eager model off fp32 by {error:.3g}"


# ----------------------------------------------------------------------------------------------------------------
# (3) sdpa: a row whose every key is padding stays finite


def bias_of(kind, num_heads):
    if kind == "alibi":
        return ALiBiBias(num_heads)
    if kind == "t5":  # not a function of |i - j| alone: the triangles take sdpa's dense-mask path
        bias = T5RelativeBias(num_heads, num_buckets=8, max_distance=6)
        torch.nn.init.normal_(bias.relative_attention_bias.weight)
        return bias
    return None


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("seq_len", [13, 150])  # 150: packed rows on CPU go in runs of 128 queries
@pytest.mark.parametrize("bias", ["none", "alibi", "t5"])
@pytest.mark.parametrize("attention_type", ["bidirectional", "causal", "dual_triangle"])
def test_sdpa_row_of_padding_attends_to_its_own_row(attention_type, bias, seq_len, packed):
    """The rule lets a padded query see itself (and sdpa lets a row without real keys see all its keys), so every
    query attends to at least one key: with every value in [1, 2], every output, padded rows included, is a convex
    combination in [1, 2], and the gradients are finite. Without that guard torch's CPU kernels return 0 for a row
    with no key allowed (other kernels NaN)."""
    generator = torch.Generator().manual_seed(seq_len)
    shape = (3, 4, seq_len, 8)
    query, key = (torch.randn(shape, generator=generator, requires_grad=True) for _ in range(2))
    value = (1 + torch.rand(shape, generator=generator)).requires_grad_()
    mask = torch.ones(3, seq_len, dtype=torch.long)
    mask[1, seq_len // 2 :] = 0
    mask[2] = 0  # every key of this row is padding
    documents = None
    if packed:  # row 0: two documents; row 1: three, its last one all padding; row 2: two, all padding
        documents = torch.zeros(3, seq_len, dtype=torch.long)
        documents[:, seq_len // 3 :] = 1
        documents[1, seq_len - 3 :] = 2
    output, _ = attend(
        query,
        key,
        value,
        implementation="sdpa",
        attention_mask=mask,
        document_ids=documents,
        attention_type=attention_type,
        bias_module=bias_of(bias, 4),
    )
    assert torch.isfinite(output).all(), "non-finite attention output"
    low, high = output.min().item(), output.max().item()
    assert 1 - 1e-5 <= low and high <= 2 + 1e-5, (
        f"outputs in [{low:.3g}, {high:.3g}]: a row attended to no key (values lie in [1, 2])"
    )
    output.pow(2).sum().backward()
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        assert torch.isfinite(tensor.grad).all(), f"non-finite gradient of the {name}"


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_sdpa_model_trains_on_a_batch_with_a_fully_padded_row(case):
    """Every family through sdpa: finite logits, loss and gradients with a row of padding only. (On CPU torch's
    sdpa kernels return 0 for a row with no key allowed rather than NaN, so here it is the test above that finds a
    missing guard; kernels that return NaN would fail this one too.)"""
    family, overrides = FAMILY_CASES[case]
    model = family_model(family, "sdpa", **overrides).train()
    input_ids, attention_mask = batch(fully_padded_row=True)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert torch.isfinite(output.logits).all(), "non-finite logits"
    output.loss.backward()
    bad = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert torch.isfinite(output.loss) and not bad, f"non-finite loss or gradients of {bad}"


# ----------------------------------------------------------------------------------------------------------------
# (4) flex_attention refuses attention dropout in training


@pytest.mark.parametrize("case", ["dta-dual-triangle", "homa-pairwise", "dstg-dstg"])
def test_flex_attention_refuses_attention_dropout_in_training(case, uncompiled_flex):
    """On CPU flex_attention's own kernel runs without gradients only (with them the forward takes sdpa, which
    drops): a training forward there must refuse attention dropout, naming the field, its value and what takes it,
    where a silent run would train without the dropout the config asks for."""
    family, overrides = FAMILY_CASES[case]
    model = family_model(family, "flex_attention", attention_dropout=0.1, **overrides).train()
    input_ids, attention_mask = batch()
    with torch.no_grad(), pytest.raises(ValueError) as refused:
        model(input_ids=input_ids, attention_mask=attention_mask)
    message = str(refused.value)
    assert "attention_dropout=0.1" in message and "flex_attention" in message, message
    assert "sdpa" in message and "eager" in message, f"the error names no implementation that drops: {message}"
    assert "\n" not in message


# ----------------------------------------------------------------------------------------------------------------
# (5) the automatic kernel choice: sdpa on every device but CUDA


def automatic_choice(config, device):
    """The kernel a bf16 run on packed rows trains with when none is named."""
    return choose_attention(config, device, packed=True, half_precision=True)


NON_CUDA_DEVICES = ("cpu", "mps", "xpu", "meta", "hpu", "cpu:0", "mps:0")


def test_the_automatic_kernel_is_sdpa_on_every_device_that_is_not_cuda():
    config = DTABertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        attention_type="dual_triangle",
        position_embedding_type="rope",
    )
    assert config.varlen_blocker is None  # this model trains through varlen where a GPU allows it
    for device in NON_CUDA_DEVICES:
        choice = automatic_choice(config, device)
        assert choice.implementation == "sdpa", f"{device!r} gets {choice.implementation!r}"
        assert device.split(":")[0] in choice.reason, f"the reason does not name the device: {choice.reason!r}"
    on_cuda = automatic_choice(config, "cuda")
    for device in ("cuda:0", "cuda:1"):
        assert automatic_choice(config, device) == on_cuda, f"{device!r} is not taken as CUDA"
    if on_cuda.implementation != "varlen":
        pytest.skip(f"on CUDA this torch takes {on_cuda.implementation!r} too ({on_cuda.reason})")


# ----------------------------------------------------------------------------------------------------------------
# (6) model paths: local folders told from Hub ids before any network call


@pytest.fixture
def in_a_project(tmp_path, monkeypatch):
    """A working directory holding ``runs/demo`` (a checkpoint folder's parent) and nothing named like a Hub org."""
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "runs" / "demo" / "config.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_path_under_an_existing_folder_is_local_and_named_missing(in_a_project):
    check_model_path("runs/demo")  # a checkpoint folder passes
    with pytest.raises(ValueError) as missing:
        check_model_path("runs/x", key="--model")  # has a Hub id's shape, but runs/ is a folder here
    message = str(missing.value)
    assert message.startswith("--model='runs/x'") and "does not exist" in message, message
    assert "'demo'" in message, f"the folders that do exist are not listed: {message}"


@pytest.mark.parametrize("path", ["org/name/extra", "a/b/c/d"])
def test_a_hub_id_with_more_than_one_slash_is_refused(in_a_project, path):
    with pytest.raises(ValueError) as refused:
        check_model_path(path)
    assert str(refused.value).startswith(f"model.path={path!r}") and "does not exist" in str(refused.value)


@pytest.mark.parametrize("hub_id", ["bert-base-uncased", "org/name", "org/name.v2"])
def test_a_hub_id_shape_without_a_local_folder_passes_to_the_hub(in_a_project, hub_id):
    assert check_model_path(hub_id) is None


# ----------------------------------------------------------------------------------------------------------------
# (7) the SQuAD summary: the model's score minus the baseline's


SQUAD_EXAMPLES = [
    {"id": "q1", "answers": {"text": ["William"], "answer_start": [0]}},
    {"id": "q2", "answers": {"text": ["Rollo"], "answer_start": [0]}},
    {"id": "q3", "answers": {"text": [], "answer_start": []}},
    {"id": "q4", "answers": {"text": [], "answer_start": []}},
]


def squad_results(answers):
    """A SQuAD v2 run's results.json as the printed summary and the model card read it, the model answering
    ``answers`` (id -> text, "" for no answer), beside the always-no-answer baseline on the same questions."""
    predictions = [{"id": e["id"], "prediction_text": answers[e["id"]], "no_answer_score": 0.0} for e in SQUAD_EXAMPLES]
    references = [{"id": e["id"], "answers": e["answers"]} for e in SQUAD_EXAMPLES]
    metrics = load_metric("squad", "v2").compute(
        predictions=predictions, references=references, no_answer_threshold=None
    )
    source = {
        "origin": "local",
        "name": "dev.json",
        "articles": None,
        "whole_hub_split": False,
        "capped": False,
        "examples": len(SQUAD_EXAMPLES),
        "available": len(SQUAD_EXAMPLES),
    }
    return {
        "task": "squad_v2",
        "pipeline_tag": "question-answering",
        "problem_type": "question_answering",
        "metric_config": "v2",
        "main_metric": "f1",
        "metrics": {"validation": metrics},
        "baseline": {
            "name": "always no answer",
            "metrics": {"validation": no_answer_baseline(SQUAD_EXAMPLES, version_2=True)},
        },
        "best_point": {"learning_rate": 3e-5},
        "grid": [{"learning_rate": 3e-5, "f1": metrics["f1"]}],
        "steps": 10,
        "best_step": 10,
        "eval_steps": 5,
        "data": {"validation": source},
        "initialised_weights": [],
        "base_checkpoint": "runs/base",
        "base_model_note": "a local checkpoint",
    }


def card_text(results):
    record = RunRecord(
        config={"model_type": "dta_bert"},
        results=results,
        run={"data": {"max_length": 64}, "train": {}},
        folder="runs/squad",
    )
    return str(build_model_card(record))


@pytest.mark.parametrize(
    "answers,expected",
    [
        ({"q1": "William", "q2": "Rollo", "q3": "", "q4": ""}, +50.0),  # every question right: 100 vs 50
        ({"q1": "", "q2": "", "q3": "Rollo", "q4": "William"}, -50.0),  # every question wrong: 0 vs 50
        ({"q1": "William", "q2": "", "q3": "", "q4": "Rollo"}, 0.0),
    ],
)
def test_squad_summary_margin_is_the_model_minus_the_baseline(answers, expected):
    """The printed summary and the model card both say "the model's f1 minus the baseline's": a model better than
    answering nothing shows a positive margin, a worse one a negative margin."""
    results = squad_results(answers)
    model_f1 = results["metrics"]["validation"]["f1"]
    baseline_f1 = results["baseline"]["metrics"]["validation"]["f1"]
    assert baseline_f1 == pytest.approx(50.0) and model_f1 - baseline_f1 == pytest.approx(expected)
    summary = format_results(results)
    printed = re.search(r"the model's f1 minus the baseline's: ([+-]\d+\.\d+)", summary)
    assert printed, summary
    assert float(printed.group(1)) == pytest.approx(expected), printed.group(0)
    card = card_text(results)
    carded = re.search(r"minus the baseline's: validation ([+-]\d+\.\d+)", card)
    assert carded, card
    assert float(carded.group(1)) == pytest.approx(expected), carded.group(0)


# ----------------------------------------------------------------------------------------------------------------
# (8) the HOMA paper's Table 2, cell by cell


def read_paper_table2(text):
    """Table 2 of the HOMA seed's text: {row label as the sweep writes it: {"CB513 F1": value, ...}}. The table is
    tab-separated: a header of datasets (each over its metric columns), a header of metrics, section titles
    without numbers, then one row per model."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Model\t") and "CB513" in line)
    datasets, metrics = lines[start].split("\t")[1:], lines[start + 1].split("\t")[1:]
    headers, dataset = [], None
    for name, metric in zip(datasets, metrics, strict=True):
        dataset = name or dataset  # a dataset's name stands over its first column only
        headers.append(f"{dataset.replace('CASPI2', 'CASP12')} {metric}")  # the text's OCR reads CASP12 as CASPI2
    table = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        label, *cells = line.split("\t")
        if any(cell.strip() for cell in cells):
            table[label.replace("$", "")] = dict(zip(headers, map(float, cells), strict=True))
    return table


def read_table_csv(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return {
            row.pop("model"): {column: float(value) for column, value in row.items()} for row in csv.DictReader(handle)
        }


def test_the_checked_table2_csv_is_the_seeds_table():
    if not HOMA_PAPER.is_file():
        pytest.skip(f"the seeds folder {SEEDS} is absent (it exists beside the repo on dev machines and CI)")
    assert read_table_csv(HOMA_TABLE2_CSV) == read_paper_table2(HOMA_PAPER.read_text(encoding="utf-8"))


def test_paper_table2_matches_the_paper_cell_by_cell():
    """Every number of `PAPER_TABLE2` is the paper's for its row and column, and every cell of the paper in a column
    the sweep measures is there: a swapped, mistyped or dropped cell fails."""
    paper = read_table_csv(HOMA_TABLE2_CSV)
    measured = {header for columns in HOMA_COLUMNS.values() for *_, header in columns}
    assert set(PAPER_TABLE2) == set(paper)
    for label, row in paper.items():
        expected = {column: value for column, value in row.items() if column in measured}
        assert PAPER_TABLE2[label] == expected, f"{label}: ours {PAPER_TABLE2[label]}, the paper's {expected}"
    assert measured & set(paper["HOMA (w = 7)"]) == {"CB513 F1", "CB513 Acc", "Fluorescence ρ", "Stability ρ"}
