"""The transfer experiment's scripts: the pretraining corpus holds GLUE training text only, the probe's
features do not depend on padding, and the report reads what the runs wrote."""

import csv
import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from figure_checks import assert_png_drawn
from step_clock import StepClock
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.tokenization import build_tokenizer

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / "transfer" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def glue_rows(path, column, has_header=True):
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not has_header:
        return [row[column].strip() for row in rows]
    index = rows[0].index(column)
    return [row[index].strip() for row in rows[1:] if len(row) > index]


def test_corpus_holds_the_training_sentences_and_no_dev_sentence_or_label(shared_data, tmp_path):
    corpus = load_script("corpus")
    counts = corpus.write_glue(shared_data, tmp_path)
    lines = set((tmp_path / "glue_train.txt").read_text(encoding="utf-8").splitlines())
    train = {
        "SST-2": glue_rows(shared_data / "glue/SST-2/train.tsv", "sentence"),
        "RTE": glue_rows(shared_data / "glue/RTE/train.tsv", "sentence2"),
        "CoLA": glue_rows(shared_data / "glue/CoLA/train.tsv", 3, has_header=False),
    }
    for task, sentences in train.items():
        assert set(sentences) <= lines, task
    assert counts["CoLA"] == len(train["CoLA"]) and counts["RTE"] == 2 * len(train["RTE"])
    # GLUE's tasks share sentences (STS-B's dev holds MRPC training pairs): a dev sentence found in no training
    # file of the five must not be in the corpus.
    every_train = set(train["CoLA"])
    for task, columns in (
        ("SST-2", ["sentence"]),
        ("MRPC", ["#1 String", "#2 String"]),
        ("STS-B", ["sentence1", "sentence2"]),
        ("RTE", ["sentence1", "sentence2"]),
    ):
        every_train.update(*(glue_rows(shared_data / f"glue/{task}/train.tsv", column) for column in columns))
    for task, column in (("SST-2", "sentence"), ("RTE", "sentence1"), ("STS-B", "sentence1")):
        dev_only = set(glue_rows(shared_data / f"glue/{task}/dev.tsv", column)) - every_train
        assert dev_only and not dev_only & lines, task
    assert not any(line.endswith(("\t0", "\t1")) for line in lines)  # no label cells


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from pydoc_data.topics import topics

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_probe_features_are_the_same_alone_and_in_a_padded_batch(tiny_checkpoint, padding_side):
    probe = load_script("probe")
    tokenizer, model = probe.load(str(tiny_checkpoint), None)
    tokenizer.padding_side = padding_side
    sentences = ["the module is imported", "a much longer sentence about how statements are executed in order here"]
    together = probe.encode(model, tokenizer, sentences)
    alone = np.concatenate([probe.encode(model, tokenizer, [s]) for s in sentences])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # and the untrained copy is a different draw per seed, of the same shape
    _, fresh = probe.load(str(tiny_checkpoint), 1)
    assert not np.allclose(probe.encode(fresh, tokenizer, sentences), together)


def test_report_tables_from_runs(tmp_path):
    report = load_script("report")
    runs = tmp_path / "runs"
    for arm, budget, accuracy in (
        ("dta", 500000, 0.1),
        ("dta", 2000000, 0.2),
        ("bidir", 500000, 0.3),
        ("dta4x", 2000000, 0.4),
    ):  # an arm whose name holds a digit
        folder = runs / f"{arm}_{budget}"
        folder.mkdir(parents=True)
        split = {"short": {"accuracy": accuracy, "mlm_loss": 5.0}, "long": {"accuracy": accuracy / 2, "mlm_loss": 6.0}}
        (folder / "results.json").write_text(
            json.dumps(
                {
                    "tokens_seen": budget + 7,
                    "steps": budget // 2048,
                    "test": split,
                    "plan": {"epochs": budget / 1.7e6, "examples_per_step": 16 if budget < 2e6 else 64},
                    "copy_or_unigram_floor": {"short": 0.14, "long": 0.15},
                }
            )
        )
    (runs / "corpus").mkdir()
    (runs / "hfbert_500000").mkdir()  # bench/transfer/hf_bert.py's results: its own held-out split, 128 only
    (runs / "hfbert_500000" / "results.json").write_text(
        json.dumps(
            {
                "model": report.HF_BERT_MODEL,
                "tokens_seen": 499712,
                "steps": 244,
                "epochs": 0.25,
                "held_out": {"accuracy": 0.25, "floor": 0.13},
            }
        )
    )
    rows = report.pretraining_rows(runs)
    assert [(r["arm"], r["token_budget"], r["test_accuracy_128"]) for r in rows] == [
        ("bidir", 500000, 0.3),
        ("dta", 500000, 0.1),
        ("dta", 2000000, 0.2),
        ("dta4x", 2000000, 0.4),
        ("hfbert", 500000, 0.25),
    ]
    assert rows[-1]["floor_128"] == 0.13 and report.cell(rows[-1]["test_accuracy_512"]) == "-"
    assert [r["rows_per_step"] for r in rows] == [16, 16, 64, 64, 16]  # the GPU runs' larger batches stand out
    probe_rows = [
        {"model": model, "seed": seed, "task": task, "score": score + i}
        for model, seed, score in (("dta_untrained", 0, 50.0), ("dta_untrained", 1, 52.0), ("dta_2000000", "", 60.0))
        for i, task in enumerate(report.TASKS)
    ]
    probe_rows.append({"model": "dta_500000", "seed": "", "task": "cola", "score": 1.0})  # four tasks missing
    averages = report.per_seed_average(probe_rows)
    assert averages["dta_untrained"] == [52.0, 54.0] and averages["dta_2000000"] == [62.0]
    assert "dta_500000" not in averages  # an incomplete seed is no GLUE average
    table = {row["model"]: row for row in report.task_table(probe_rows)}
    assert table["dta_untrained"]["average"] == "53.00 ± 1.41" and table["dta_500000"]["average"] == "-"
    assert table["dta_2000000"]["average"] == "62.00"  # one draw: no sd
    report.plot(rows, probe_rows, probe_rows, [], tmp_path / "transfer.png")
    assert_png_drawn(tmp_path / "transfer.png")


def test_report_rings_the_large_batch_runs_once_per_panel():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    report = load_script("report")
    figure, axis = plt.subplots()
    for points in ([(5e5, 0.1), (4.7e7, 0.5)], [(4.7e7, 0.4)]):
        report.ring_large_batches(axis, points, large_batch_runs={4.7e7: 64, 9e7: 128})
    rings = [line for line in axis.get_lines()]
    assert [list(line.get_xdata()) for line in rings] == [[4.7e7], [4.7e7]]
    assert [line.get_label() for line in rings] == ["ringed: batches of 64 / 128 rows, not 16", "_"]
    plt.close(figure)


def test_stsb_shift_scores_each_dev_subset_and_the_length_correlation(tiny_checkpoint, tmp_path):
    """A regression head on the tiny checkpoint, scored on 12 pairs split into a head of 7 and a rest of 5: each
    subset's score is the experiment's STS-B score of the predictions of its own pairs, made one pair at a time."""
    from scipy.stats import pearsonr, spearmanr
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from encoderlab.training.finetune.tasks import get_task

    shift = load_script("stsb_shift")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint, num_labels=1,
                                                               problem_type="regression")  # fmt: skip
    run_dir = tmp_path / "stsb-s0"
    model.save_pretrained(run_dir)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(run_dir)
    rng = np.random.default_rng(0)
    words = "the module is imported and every statement runs in order when a name is bound".split()
    pairs = [[" ".join(rng.choice(words, rng.integers(2, 12))) for _ in range(12)] for _ in range(2)]
    labels = rng.uniform(0, 5, 12)
    rows = shift.run_rows("setting", {"run_dir": str(run_dir), "model": "m", "seed": "0"}, get_task("stsb"), pairs,
                          labels, shift.split_subsets("validation", 12, head=7))  # fmt: skip
    model = AutoModelForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    with torch.no_grad():
        alone = np.array(
            [model(**tokenizer(a, b, return_tensors="pt")).logits.item() for a, b in zip(*pairs, strict=True)]
        )
    lengths = np.array([len(a.split()) + len(b.split()) for a, b in zip(*pairs, strict=True)])
    parts = {"head": slice(0, 7), "rest": slice(7, 12), "all": slice(0, 12)}
    assert [row["subset"] for row in rows] == list(parts)
    for row in rows:
        part = parts[row["subset"]]
        expected = 50 * (pearsonr(alone[part], labels[part])[0] + spearmanr(alone[part], labels[part])[0])
        assert row["examples"] == len(labels[part]) and row["score"] == pytest.approx(expected, abs=1e-3)
        assert row["length_spearman"] == pytest.approx(spearmanr(alone[part], lengths[part])[0], abs=1e-6)
    # the yardstick that predicts the pair's length scores what length alone scores
    for row in shift.length_rows(get_task("stsb"), pairs, labels, shift.split_subsets("validation", 12, head=7)):
        part = parts[row["subset"]]
        expected = 50 * (pearsonr(lengths[part], labels[part])[0] + spearmanr(lengths[part], labels[part])[0])
        assert row["score"] == pytest.approx(expected) and row["length_spearman"] == pytest.approx(1.0)
    # the training split is scored whole, as one subset
    (train_row,) = shift.run_rows(
        "setting",
        {"run_dir": str(run_dir), "model": "m", "seed": "0"},
        get_task("stsb"),
        pairs,
        labels,
        shift.split_subsets("train", 12, head=7),
    )
    assert train_row["subset"] == "train" and train_row["examples"] == 12
    whole = 50 * (pearsonr(alone, labels)[0] + spearmanr(alone, labels)[0])
    assert train_row["score"] == pytest.approx(whole, abs=1e-3)


def tiny_corpus(folder):
    folder.mkdir()
    (folder / "glue_train.txt").write_text("a first sentence .\nand a second one .\n\nanother document here .\n")
    (folder / "wikitext2.txt").write_text(
        "\n = First Article = \n\n Its text is short .\n\n = = A section = = \n\n"
        " More text .\n = Second Article = \n\n The second one .\n"
    )
    return folder


def test_hf_bert_reads_documents_and_articles(tmp_path):
    hf_bert = load_script("hf_bert")
    docs = hf_bert.documents(tiny_corpus(tmp_path / "corpus"))
    assert docs[:2] == ["a first sentence .\nand a second one .", "another document here ."]
    assert len(docs) == 4 and docs[2].startswith("= First Article =") and "A section" in docs[2]
    assert docs[3].startswith("= Second Article =")


def test_hf_bert_floor_is_copy_or_most_frequent(tiny_checkpoint):
    from transformers import AutoTokenizer

    hf_bert = load_script("hf_bert")
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)

    class Copy(torch.nn.Module):  # predicts the input token everywhere: right exactly where a token was kept
        def forward(self, input_ids):
            return type("Out", (), {"logits": torch.nn.functional.one_hot(input_ids, len(tokenizer)).float()})

    rows = torch.randint(10, 60, (64, hf_bert.ROW_TOKENS), generator=torch.Generator().manual_seed(0))
    scores = hf_bert.held_out_accuracy(Copy(), rows, tokenizer, seed=0, top_token_id=20)
    # ~10% of the selected tokens are kept; the floor adds the masked ones that happen to be token 20 (about 1 in
    # 50 here), and never less than copying.
    assert 0.07 < scores["accuracy"] < 0.14 and scores["masked_tokens"] > 1000
    assert scores["accuracy"] <= scores["floor"] <= scores["accuracy"] + 0.05
    # One token everywhere: guessing it is right at [MASK] and copying is right where it was kept, but a random
    # replacement is copied too (nothing in the input tells it from a kept token): the floor is ~90%, not 100%.
    one_token = torch.full((8, hf_bert.ROW_TOKENS), 20)
    assert hf_bert.held_out_accuracy(Copy(), one_token, tokenizer, seed=0, top_token_id=20)["floor"] == pytest.approx(
        0.9, abs=0.05
    )


def test_hf_bert_pretrains_a_checkpoint_finetune_can_load(tiny_checkpoint, tmp_path, capsys):
    from transformers import AutoModelForSequenceClassification

    hf_bert = load_script("hf_bert")
    corpus, out = tiny_corpus(tmp_path / "corpus"), tmp_path / "bert"
    (corpus / "glue_train.txt").write_text(
        "\n\n".join(f"document {i} says the module is imported ." * 20 for i in range(40))
    )
    hf_bert.main(["--corpus", str(corpus), "--tokenizer", str(tiny_checkpoint), "--tokens", "4096", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and results["tokens_seen"] == 4096
    assert results["documents"]["held_out"] == 4 and 0 < results["held_out"]["floor"] < 1
    # --rescore finds the same documents and masks again: the same scores, written back
    (out / "results.json").write_text(json.dumps({**results, "held_out": {"floor": -1.0}}))
    hf_bert.main(["--rescore", "--corpus", str(corpus), "--out", str(out)])
    assert json.loads((out / "results.json").read_text())["held_out"] == results["held_out"]
    model = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.num_hidden_layers == 4
    with pytest.raises(SystemExit):
        hf_bert.main(
            ["--corpus", str(corpus), "--tokenizer", str(tiny_checkpoint), "--tokens", "4096", "--out", str(out)]
        )
    assert "already holds a finished run" in capsys.readouterr().err


def test_geometry_measures_agree_with_their_definitions():
    geometry = load_script("geometry")
    same = torch.ones(5, 3, dtype=torch.float64)
    assert geometry.mean_off_diagonal_cosine(same) == pytest.approx(1.0)
    assert geometry.mean_off_diagonal_cosine(torch.eye(4, dtype=torch.float64)) == pytest.approx(0.0)
    assert geometry.first_component_share(same) is None
    line = torch.arange(6.0, dtype=torch.float64)[:, None] * torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    assert geometry.first_component_share(line) == pytest.approx(1.0)
    spread = torch.tensor([[1.0, 0], [-1, 0], [0, 0.5], [0, -0.5]], dtype=torch.float64)
    assert geometry.first_component_share(spread) == pytest.approx(0.8)  # variances 2 and 0.5


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_geometry_and_gradients_do_not_depend_on_padding(tiny_checkpoint, padding_side):
    geometry = load_script("geometry")
    tokenizer, model = geometry.load_classifier(str(tiny_checkpoint), seed=0)
    sentences = ["the module is imported", "a longer sentence about statements executed in order", "short"]
    tokenizer.padding_side = "right"
    expected = geometry.layer_geometry(model, tokenizer, sentences)
    tokenizer.padding_side = padding_side
    for got, want in zip(geometry.layer_geometry(model, tokenizer, sentences), expected, strict=True):
        assert got.pop("cls_pc1_share") == (
            None if want["cls_pc1_share"] is None else pytest.approx(want.pop("cls_pc1_share"), rel=1e-5)
        )
        assert got == pytest.approx({k: v for k, v in want.items() if k != "cls_pc1_share"}, rel=1e-5)
    one = geometry.first_gradient(model, tokenizer, sentences, [0, 1, 1])
    assert one["body_grad_norm"] > 0 and one["head_grad_norm"] > 0
    _, fresh = geometry.load_classifier(f"untrained:{tiny_checkpoint}", seed=1)
    assert geometry.body_weight_rms(fresh) != geometry.body_weight_rms(model)
    assert geometry.body_weight_rms(fresh) == pytest.approx(fresh.config.initializer_range, rel=0.1)


def test_geometry_writes_a_row_per_model_and_layer(shared_data, tiny_checkpoint, tmp_path):
    geometry = load_script("geometry")
    out = tmp_path / "geometry.csv"
    geometry.main(
        [
            "--glue",
            str(shared_data / "glue"),
            "--model",
            f"tiny={tiny_checkpoint}",
            "--model",
            f"fresh=untrained:{tiny_checkpoint}",
            "--sentences",
            "20",
            "--gradient-sentences",
            "40",
            "--out",
            str(out),
        ]
    )
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["model"], row["layer"]) for row in rows] == [(m, str(i)) for m in ("tiny", "fresh") for i in range(3)]
    assert rows[0]["cls_pc1_share"] == "" and float(rows[1]["cls_pc1_share"]) > 0  # the first token's embedding
    assert {row["gradient_sentences"] for row in rows} == {"40"}
    assert_png_drawn(out.with_suffix(".png"))


def test_settings_table_keeps_shared_models_and_the_given_seeds(tmp_path, capsys):
    settings_table = load_script("settings_table")
    header = "model,task,seed,score\n"
    (tmp_path / "low.csv").write_text(
        header + "a,sst2,0,50\na,sst2,1,54\na,sst2,2,90\nb,sst2,0,60\nonly_here,sst2,0,1\na,cola,0,5\n"
    )
    (tmp_path / "high.csv").write_text(header + "a,sst2,0,70\na,sst2,1,72\nb,sst2,0,61\nb,sst2,1,63\n")
    out = tmp_path / "grid"
    settings_table.main(
        [
            "--task",
            "sst2",
            "--seeds",
            "0",
            "1",
            "--setting",
            f"low={tmp_path / 'low.csv'}",
            "--setting",
            f"high={tmp_path / 'high.csv'}",
            "--out",
            str(out),
        ]
    )
    with open(out.with_suffix(".csv")) as handle:
        rows = {(row["setting"], row["model"]): row for row in csv.DictReader(handle)}
    assert set(rows) == {("low", "a"), ("low", "b"), ("high", "a"), ("high", "b")}  # only_here ran one setting
    assert float(rows[("low", "a")]["mean"]) == 52.0 and rows[("low", "a")]["seeds"] == "2"  # seed 2 left out
    assert float(rows[("high", "b")]["sd"]) == pytest.approx(np.std([61, 63], ddof=1), abs=1e-3)
    assert rows[("low", "b")]["seed_1"] == "" and float(rows[("low", "b")]["seed_0"]) == 60.0
    assert_png_drawn(out.with_suffix(".png"))
    with pytest.raises(SystemExit):
        settings_table.main(
            ["--task", "sst2", "--seeds", "0", "--setting", f"x={tmp_path / 'none.csv'}", "--out", str(out)]
        )
    assert "--setting x=" in capsys.readouterr().err


def test_settings_table_yardsticks_average_each_settings_csv(tmp_path, capsys):
    settings_table = load_script("settings_table")
    header = "model,task,seed,score\n"
    for name in ("low", "high"):
        (tmp_path / f"{name}.csv").write_text(header + "a,sst2,0,50\na_untrained,sst2,0,40\n")
    (tmp_path / "probe_low.csv").write_text(
        header + "a,sst2,,55\na_untrained,sst2,0,30\na_untrained,sst2,1,34\na_untrained,cola,0,99\n"
    )
    (tmp_path / "probe_high.csv").write_text(header + "a,sst2,,65\na_untrained,sst2,0,44\n")
    (tmp_path / "bow_low.csv").write_text("task,seed,score\nsst2,,61\n")
    (tmp_path / "bow_high.csv").write_text("task,seed,score\nsst2,,71\n")
    out = tmp_path / "curve"
    settings = ["--setting", f"low={tmp_path / 'low.csv'}", "--setting", f"high={tmp_path / 'high.csv'}"]
    probe = f"probe:a_untrained={tmp_path / 'probe_low.csv'},{tmp_path / 'probe_high.csv'}"
    settings_table.main(
        [
            "--task",
            "sst2",
            "--seeds",
            "0",
            *settings,
            "--out",
            str(out),
            "--yardstick",
            f"bow={tmp_path / 'bow_low.csv'},{tmp_path / 'bow_high.csv'}",
            "--yardstick",
            probe,
        ]
    )
    with open(out.with_suffix(".csv")) as handle:
        rows = {(row["setting"], row["model"]): row for row in csv.DictReader(handle)}
    assert float(rows[("low", "probe")]["mean"]) == 32.0 and rows[("low", "probe")]["seeds"] == "2"  # a's row out
    assert float(rows[("high", "probe")]["mean"]) == 44.0 and float(rows[("high", "bow")]["mean"]) == 71.0
    assert float(rows[("low", "a")]["mean"]) == 50.0
    assert_png_drawn(out.with_suffix(".png"))
    with pytest.raises(SystemExit):  # one CSV for two settings
        settings_table.main(
            [
                "--task",
                "sst2",
                "--seeds",
                "0",
                *settings,
                "--out",
                str(out),
                "--yardstick",
                f"bow={tmp_path / 'bow_low.csv'}",
            ]
        )
    assert "one CSV per setting" in capsys.readouterr().err


def test_gpu_pretrain_budget_is_what_the_slower_arm_finishes():
    gpu_pretrain = load_script("gpu_pretrain")
    calibration = {
        "dta": dict(tokens=2e6, train_seconds=10.0, tokens_per_second=250e3),
        "bidir": dict(tokens=2e6, train_seconds=12.0, tokens_per_second=200e3),
    }
    budgets = gpu_pretrain.plan_budgets({"1x": ("dta", "bidir")}, calibration, wall=30.0, seconds=300.0, quick=False)
    # fixed cost 30 - 10 = 20 s; the slower arm's 200k tokens/s over the 280 s left, at the safety margin
    assert budgets == {"1x": int(200e3 * 280 * gpu_pretrain.SAFETY // 1e6 * 1e6)} == {"1x": 47_000_000}


def test_gpu_pretrain_rate_leaves_out_the_first_steps(tmp_path):
    gpu_pretrain = load_script("gpu_pretrain")
    (tmp_path / "results.json").write_text(json.dumps({"tokens_seen": 3000}))
    rows = [
        dict(step=10, loss=5, num_input_tokens_seen=1000, train_runtime=8.0),  # 8 s of start-up
        dict(step=20, loss=4, num_input_tokens_seen=2000, train_runtime=9.0),
        dict(step=30, loss=3, num_input_tokens_seen=3000, train_runtime=10.0),
        dict(step=30, train_runtime=10.5, train_loss=4),
    ]
    with open(tmp_path / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(
            handle, fieldnames=["step", "loss", "num_input_tokens_seen", "train_runtime", "train_loss"]
        )
        writer.writeheader()
        writer.writerows(rows)
    assert gpu_pretrain.measured(tmp_path) == dict(tokens=3000, train_seconds=10.5, tokens_per_second=1000.0)
    assert gpu_pretrain.measured(tmp_path / "missing") is None


def test_gpu_pretrain_on_cpu_returns_whole_corpus_runs(shared_data, tmp_path, monkeypatch):
    """The GPU script end to end (--device cpu --quick, the campaign's sizes 1x and 9x at their real widths):
    calibration, one budget per size planned from it, and the finished runs packed in parts within the return limit
    that reassemble into fp32 run folders of each size's body, each trained on every window of its documents.

    The plan reads no clock of this machine: the budget runs on a step clock (each reading a minute, so the
    calibration took 60 s), and the runs' own rates are replaced by fixed ones, as if measured on one steady
    machine; the planned budgets are then the same on any machine."""
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    gpu_pretrain, returned_runs = load_script("gpu_pretrain"), load_script("returned_runs")
    rates = {"dta": 400.0, "bidir": 300.0, "dta9x": 120.0, "bidir9x": 100.0}  # tokens/s
    measured = gpu_pretrain.measured

    def at_fixed_rates(run_dir):
        result = measured(run_dir)
        rate = rates[run_dir.name.rsplit("_", 1)[0]]
        return result and dict(result, train_seconds=result["tokens"] / rate, tokens_per_second=rate)

    monkeypatch.setattr(gpu_pretrain, "measured", at_fixed_rates)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the script's scratch folder, to read the originals
    out = tmp_path / "out"
    assert (
        gpu_pretrain.main(
            ["--device", "cpu", "--quick", "--out", str(out), "--data", str(shared_data), "--minutes", "5.65"],
            clock=StepClock(step=60),
        )
        == 0
    )  # the default sizes: 1x and 9x
    summary = json.loads((out / "gpu_pretrain_summary.json").read_text())
    budgets = summary["budgets"]
    assert summary["calibration_wall_seconds"] == 60
    assert budgets == gpu_pretrain.plan_budgets(
        {size: gpu_pretrain.SIZES[size] for size in ("1x", "9x")},
        summary["calibration"],
        60,
        summary["planned_seconds"],
        quick=True,
    )
    assert list(budgets) == ["1x", "9x"] and budgets["1x"] > budgets["9x"] > 0  # the same minutes: 1x runs faster
    # one budget per size: both attentions of a size train on the same tokens
    assert set(summary["runs"]) == {f"{arm}_{budgets[size]}" for size in budgets for arm in gpu_pretrain.SIZES[size]}
    for size, budget in budgets.items():
        dta, bidir = (summary["runs"][f"{arm}_{budget}"]["tokens"] for arm in gpu_pretrain.SIZES[size])
        assert dta == bidir
    # what --out holds: the summary and the parts, each at most --part-mib, together within --max-return-mib
    parts = [out / name for name in summary["parts"]]
    assert sorted(out.iterdir()) == sorted([out / returned_runs.SUMMARY, *parts]) and len(parts) > 1
    assert all(part.stat().st_size <= returned_runs.PART_MIB * 2**20 for part in parts)
    assert sum(part.stat().st_size for part in parts) <= returned_runs.MAX_RETURN_MIB * 2**20
    runs = returned_runs.unpack(out, tmp_path / "runs")
    assert sorted(folder.name for folder in runs) == sorted(summary["runs"])
    assert not list((tmp_path / "runs").rglob("checkpoint-*"))
    (scratch,) = tmp_path.glob("encoderlab_gpu_*")
    body = {}
    for folder in runs:
        results = json.loads((folder / "results.json").read_text())
        budget = int(folder.name.split("_")[-1])
        assert results["tokens_seen"] == summary["runs"][folder.name]["tokens"] >= 0.9 * budget
        # the quick corpus (60 documents) in windows of 32: far more rows than documents
        assert results["plan"]["train_examples"] > 3 * results["documents"]["train"]
        # the weights came back through bf16 and are fp32 again: the original's bf16 rounding, exactly
        original = load_file(scratch / "transfer" / folder.name / "model.safetensors")
        unpacked = load_file(folder / "model.safetensors")
        assert unpacked.keys() == original.keys()
        for name, tensor in unpacked.items():
            assert tensor.dtype == torch.float32
            torch.testing.assert_close(tensor, original[name].to(torch.bfloat16).float(), rtol=0, atol=0)
        model = AutoModelForMaskedLM.from_pretrained(folder)
        words = model.get_input_embeddings().weight.numel()
        body[folder.name.split("_")[0]] = sum(p.numel() for p in model.parameters()) - words
    assert body["dta"] == body["bidir"] and body["dta9x"] == body["bidir9x"]
    assert 8.5 < body["dta9x"] / body["dta"] < 9.5  # the 9x body: 4 layers of 384 against the demo's 4 of 128


def test_returned_runs_refuse_sizes_that_would_not_come_back(tmp_path):
    """A run comes back as bf16 weights without checkpoints; sizes whose runs exceed --max-return-mib are refused
    with each size's share, and an unpack never writes over run folders already there."""
    from safetensors.torch import load_file, save_file

    returned_runs = load_script("returned_runs")
    run = tmp_path / "dta_1000"
    (run / "checkpoint-5").mkdir(parents=True)
    (run / "checkpoint-5" / "optimizer.pt").write_bytes(b"0" * 1000)
    weights = 2**20  # 4 MiB in fp32
    save_file(
        {"w": torch.ones(weights), "step": torch.tensor([3])}, run / "model.safetensors", metadata={"format": "pt"}
    )
    copy = returned_runs.returned_copy(run, tmp_path / "returned" / "dta")
    assert not (copy / "checkpoint-5").exists()
    tensors = load_file(copy / "model.safetensors")
    assert tensors["w"].dtype == torch.bfloat16 and tensors["step"].dtype == torch.int64
    assert 2 * weights < returned_runs.folder_bytes(copy) < 2 * weights + 2**12
    assert returned_runs.check_returnable({"1x": [copy]}, limit_mib=2.1) == {"1x": 2.0}
    with pytest.raises(SystemExit, match=r"--sizes 1x 4x: .* \(1x 2.0 MiB, 4x 4.0 MiB, .*over --max-return-mib=5"):
        returned_runs.check_returnable({"1x": [copy], "4x": [copy] * 2}, limit_mib=5)
    with pytest.raises(SystemExit, match=r"--max-return-mib=0.0 must be > 0"):  # before any work
        load_script("gpu_pretrain").main(["--device", "cpu", "--quick", "--max-return-mib", "0"])


def test_merge_runs_renames_each_source_and_refuses_a_run_held_twice(tmp_path):
    from encoderlab.results.rows import read_results, write_rows

    merge_runs = load_script("merge_runs")
    for folder, models in (("fast", ["bidir_47000000", "dta_47000000"]), ("slow", ["bidir_untrained"])):
        (tmp_path / folder).mkdir()
        write_rows(
            tmp_path / folder / "finetune_runs.csv",
            [
                {"model": m, "task": t, "seed": s, "score": f"{i}"}
                for i, (m, t, s) in enumerate((m, t, s) for m in models for t in ("cola", "stsb") for s in "01")
            ],
        )
    out = tmp_path / "merged"
    assert (
        merge_runs.main(
            [
                f"{tmp_path / 'fast'}:lr3e-3",
                str(tmp_path / "slow" / "finetune_runs.csv"),
                "--models",
                "bidir_47000000",
                "bidir_untrained",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = read_results(out / "finetune_runs.csv")
    assert sorted({row["model"] for row in rows}) == ["bidir_47000000_lr3e-3", "bidir_untrained"]
    assert len(rows) == 8 and [row["score"] for row in rows[:4]] == ["0", "1", "2", "3"]
    with pytest.raises(SystemExit):  # the same folder twice without suffixes: every run twice
        merge_runs.main([str(tmp_path / "slow"), str(tmp_path / "slow"), "--out", str(tmp_path / "twice")])
    with pytest.raises(ValueError, match="in both"):
        merge_runs.merge([str(tmp_path / "slow"), str(tmp_path / "slow")], set())
    with pytest.raises(SystemExit):  # never over an existing merge
        merge_runs.main([str(tmp_path / "slow"), "--out", str(out)])
    assert not (tmp_path / "twice").exists()
    # @MODEL keeps one source's arm only: each arm from the sweep that ran it at its own rate
    picked = merge_runs.merge(
        [f"{tmp_path / 'fast'}@dta_47000000", f"{tmp_path / 'fast'}:lr3e-3@bidir_47000000"], set()
    )
    assert sorted({row["model"] for row in picked}) == ["bidir_47000000_lr3e-3", "dta_47000000"]
    assert len(picked) == 8
    renamed = merge_runs.merge([f"{out}@bidir_47000000_lr3e-3=bidir", f"{tmp_path / 'slow'}:x@bidir_untrained"], set())
    assert sorted({row["model"] for row in renamed}) == ["bidir", "bidir_untrained_x"] and len(renamed) == 8
    # #TASK keeps one source's tasks only: one sweep's CoLA beside another's STS-B, under one name
    mixed = merge_runs.merge(
        [f"{tmp_path / 'fast'}@bidir_47000000#cola", f"{out}@bidir_47000000_lr3e-3=bidir_47000000#stsb"], set()
    )
    assert {(row["task"], row["score"]) for row in mixed} == {
        ("cola", "0"),
        ("cola", "1"),
        ("stsb", "2"),
        ("stsb", "3"),
    }
    with pytest.raises(ValueError, match="no runs of the tasks \\['rte'\\]"):
        merge_runs.merge([f"{tmp_path / 'slow'}#rte"], set())


def test_yardsticks_first_examples_are_the_ones_train_limit_keeps(shared_data):
    """`--first` (bag of words, probe) must train on the examples a `data.train_limit=N` fine-tuning run trains on."""
    from encoderlab.training.finetune.config import FinetuneDataSection
    from encoderlab.training.finetune.data import split_file, split_rows
    from encoderlab.training.finetune.tasks import get_task

    bow = load_script("probe").bow
    for name, count in (("sst2", 50), ("mrpc", 7)):
        task = get_task(name)
        rows, _ = split_rows(task, FinetuneDataSection(path=str(shared_data / "glue"), train_limit=count), "train")
        texts, labels = bow.texts_and_labels(task, split_file(task, bow.GlueData(shared_data / "glue"), "train"))
        first_texts, first_labels = bow.sample_examples(texts, labels, count, seed=None)
        assert first_texts == [[row[column] for row in rows] for column in task.local.text_columns]
        drawn_texts, _ = bow.sample_examples(texts, labels, count, seed=0)
        assert drawn_texts != first_texts and len(first_labels) == count


def test_stsb_cosine_scores_each_sentence_encoded_alone(shared_data, tiny_checkpoint, tmp_path):
    script = load_script("stsb_cosine")
    out = tmp_path / "cosine.csv"
    script.main(
        [
            "--model",
            f"tiny={tiny_checkpoint}",
            "--model",
            f"fresh=untrained:{tiny_checkpoint}",
            "--seeds",
            "3",
            "--eval-limit",
            "40",
            "--glue",
            str(shared_data / "glue"),
            "--out",
            str(out),
        ]
    )
    rows = {row["model"]: row for row in csv.DictReader(out.open())}
    assert list(rows) == ["word counts", "tiny", "fresh"] and rows["fresh"]["seed"] == "3"
    first, second, gold = script.dev_pairs(shared_data / "glue", 40)
    assert len(gold) == 40 and int(rows["tiny"]["dev_pairs"]) == 40
    tokenizer, model = script.probe.load(str(tiny_checkpoint), None)
    a = np.concatenate([script.probe.encode(model, tokenizer, [s]) for s in first])
    b = np.concatenate([script.probe.encode(model, tokenizer, [s]) for s in second])
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert float(rows["tiny"]["pearson"]) == pytest.approx(100 * np.corrcoef(cosines, gold)[0, 1], abs=1e-3)
    centre = np.concatenate([a, b]).mean(0)
    a, b = a - centre, b - centre
    centred = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert float(rows["tiny"]["centred_pearson"]) == pytest.approx(100 * np.corrcoef(centred, gold)[0, 1], abs=1e-3)
    # the second sentence without its [CLS]: its own forward pass on the ids after the first
    with torch.no_grad():
        v = np.stack(
            [
                model(input_ids=torch.tensor([tokenizer(s)["input_ids"][1:]])).last_hidden_state[0].mean(0).numpy()
                for s in second
            ]
        )
    a = a + centre
    without = (a * v).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(v, axis=1)
    assert float(rows["tiny"]["second_without_cls_pearson"]) == pytest.approx(
        100 * np.corrcoef(without, gold)[0, 1], abs=1e-3
    )


def test_word_count_cosine_reads_shared_words_only():
    script = load_script("stsb_cosine")
    row = script.word_count_row(
        ["a cat sat", "dogs run fast", "red blue"], ["a cat sat", "dogs run", "green"], np.array([1.0, 2 / 6**0.5, 0.0])
    )  # gold = the count vectors' own cosines
    assert row["pearson"] == pytest.approx(100) and row["spearman"] == pytest.approx(100)


def test_stsb_cosine_plot_draws_each_arm_against_tokens(tmp_path):
    script = load_script("stsb_cosine")
    rows = [
        {"model": "word counts", "pearson": 65.0},
        {"model": "dta_500000", "pearson": 40.0},
        {"model": "dta_2000000", "pearson": 50.0},
        {"model": "dta_untrained", "pearson": 60.0},
        {"model": "dta_untrained", "pearson": 62.0},
    ]
    pretraining = [
        {"arm": "dta", "token_budget": budget, "tokens_seen": budget + 1, "rows_per_step": 16}
        for budget in (500000, 2000000)
    ]
    script.plot(rows, pretraining, tmp_path / "cosine.png")
    assert_png_drawn(tmp_path / "cosine.png")


def test_biencoder_glue_reads_pairs_separately_and_single_sentences_jointly(shared_data, tiny_checkpoint, tmp_path):
    """The CPU follow-up of the GPU arms: each checkpoint and its untrained copy, the pair tasks as bi-encoders (mean
    pooling) and the single-sentence tasks as before, at the protocol's rate; a later --set wins (here: 2 steps)."""
    import shutil

    import yaml

    from encoderlab.results.rows import read_results

    script = load_script("biencoder_glue")
    run = tmp_path / "tiny9x_1000"
    shutil.copytree(tiny_checkpoint, run)
    out = tmp_path / "sep"
    assert (
        script.main(
            [
                str(run),
                "--out-dir",
                str(out),
                "--glue",
                str(shared_data / "glue"),
                "--tasks",
                "sst2",
                "rte",
                "--seeds",
                "0",
                "--workers",
                "1",
                "--set",
                "train.max_steps=2",
                "--set",
                "train.eval_steps=2",
                "--set",
                "data.train_limit=64",
                "--set",
                "data.eval_limit=16",
            ]
        )
        == 0
    )
    rows = read_results(out / "finetune_runs.csv")
    assert sorted((row["model"], row["task"]) for row in rows) == [
        ("tiny9x_1000", "rte"),
        ("tiny9x_1000", "sst2"),
        ("tiny9x_untrained", "rte"),
        ("tiny9x_untrained", "sst2"),
    ]
    for model in ("tiny9x_1000", "tiny9x_untrained"):
        for task, encoding, pooling in (("rte", "separate", "mean"), ("sst2", "joint", "cls")):
            run_dir = out / "runs" / model / f"{task}-s0"
            config = json.loads((run_dir / "config.json").read_text())
            assert (config.get("classifier_pair_encoding", "joint"), config.get("classifier_pooling", "cls")) == (
                encoding,
                pooling,
            ), (model, task)
            train = yaml.safe_load((run_dir / "run_config.yaml").read_text())["train"]
            assert (train["lr"], train["max_steps"], train["seed"]) == (1e-3, 2, 0)
    assert "tiny9x_untrained" in (out / "finetune_summary.md").read_text()
