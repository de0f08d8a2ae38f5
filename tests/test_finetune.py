"""encoderlab finetune: metric modules against scikit-learn/scipy, token windows, data checks, and tiny end-to-end
runs per task kind (GLUE classification, STS-B regression, secondary structure, fluorescence, own CSV, LoRA) with
their run folders, cards, reloads and --resume."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from figure_checks import assert_png_drawn
from huggingface_hub import ModelCard
from remote_code import without_encoderlab
from safetensors.torch import load_file
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.cli import main
from encoderlab.metrics import load_metric
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.report import glue_table
from encoderlab.training.finetune.run import task_list
from encoderlab.training.finetune.tokens import encode_words, word_windows

# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prediction_file(tmp_path_factory):
    """A fixed prediction file: 200 class predictions/references (3 classes) and 200 scores, seed 0."""
    rng = np.random.default_rng(0)
    references = rng.integers(0, 3, 200)
    predictions = np.where(rng.random(200) < 0.6, references, rng.integers(0, 3, 200))
    scores = rng.normal(size=200)
    data = {
        "classes": {"predictions": predictions.tolist(), "references": references.tolist()},
        "scores": {"predictions": (scores + rng.normal(size=200)).tolist(), "references": scores.tolist()},
    }
    path = tmp_path_factory.mktemp("predictions") / "predictions.json"
    path.write_text(json.dumps(data))
    return json.loads(path.read_text())


@pytest.mark.parametrize("config", ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"])
def test_each_glue_metric_equals_sklearn_and_scipy(prediction_file, config):
    if config == "stsb":
        p, r = prediction_file["scores"]["predictions"], prediction_file["scores"]["references"]
        expected = {"pearson": pearsonr(p, r).statistic, "spearmanr": spearmanr(p, r).statistic}
    else:
        classes = 3 if config == "mnli" else 2
        p = [x % classes for x in prediction_file["classes"]["predictions"]]
        r = [x % classes for x in prediction_file["classes"]["references"]]
        expected = (
            {"matthews_correlation": matthews_corrcoef(r, p)}
            if config == "cola"
            else {"accuracy": accuracy_score(r, p)}
        )
        if config in ("mrpc", "qqp"):
            expected["f1"] = f1_score(r, p)
    assert load_metric("glue", config).compute(predictions=p, references=r) == pytest.approx(expected, abs=1e-12)


def test_regression_and_token_metrics_equal_scipy_and_sklearn(prediction_file):
    p, r = prediction_file["scores"]["predictions"], prediction_file["scores"]["references"]
    assert load_metric("regression").compute(predictions=p, references=r) == pytest.approx(
        {"pearson": pearsonr(p, r).statistic, "spearmanr": spearmanr(p, r).statistic, "mse": mean_squared_error(r, p)},
        abs=1e-12,
    )
    p, r = np.array(prediction_file["classes"]["predictions"]), np.array(prediction_file["classes"]["references"])
    r_ignored = np.where(np.arange(200) % 7 == 0, -100, r)  # unresolved residues
    keep = r_ignored != -100
    result = load_metric("sequence_labeling", "ss3").compute(predictions=p, references=r_ignored)
    assert result == pytest.approx(
        {"q3": accuracy_score(r[keep], p[keep]), "macro_f1": f1_score(r[keep], p[keep], average="macro")}, abs=1e-12
    )


def test_unknown_metric_names_the_allowed_ones():
    with pytest.raises(ValueError, match="metric='accuracy' is not a metric module of encoderlab; allowed"):
        load_metric("accuracy")


# ---------------------------------------------------------------------------------------------
# Token windows: every word in exactly one window
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_word_windows_fit_and_their_owned_ranges_partition_the_words(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 4, rng.integers(1, 80)).tolist()
    budget = int(rng.integers(3, 20))
    windows = word_windows(counts, budget)
    owned = []
    for start, end, own_start, own_end in windows:
        assert sum(counts[start:end]) <= budget
        assert start <= own_start < own_end <= end
        owned += range(own_start, own_end)
    assert owned == list(range(len(counts)))


def test_long_chain_is_windowed_in_the_pipeline_format_and_every_residue_scored():
    from encoderlab.tokenization import tape_iupac_tokenizer

    tokenizer = tape_iupac_tokenizer()
    tokenizer.model_max_length = 40
    chain = "MKVLAAGIVWRRDEEHHKLPQ" * 7  # 147 residues, windows of at most 40 tokens
    windows = encode_words(tokenizer, list(chain), 40)
    assert len(windows) > 1
    # no "will result in indexing errors" warning: the long chain never reaches the model whole
    assert not tokenizer.deprecation_warnings.get("sequence-length-is-longer-than-the-specified-maximum")
    short = encode_words(tokenizer, list(chain[:30]), 40)
    assert short[0]["input_ids"] == tokenizer(chain[:30])["input_ids"]  # <cls> ... <sep>, as the pipeline encodes
    scored = []
    for window in windows:
        assert len(window["input_ids"]) <= 40
        assert window["input_ids"][0] == tokenizer.cls_token_id and window["input_ids"][-1] == tokenizer.sep_token_id
        scored += [w for w in window["word_ids"] if w is not None and window["owned"][0] <= w < window["owned"][1]]
    assert scored == list(range(len(chain)))


# ---------------------------------------------------------------------------------------------
# Tiny checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    """A tiny DTA-BERT masked LM with a WordPiece tokenizer trained on English text, saved to a folder."""
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values()), vocab_size=800, model_max_length=128)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tiny_dta):
    """A tiny transformers BertForMaskedLM (a baseline encoder, no encoderlab code) with the same tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_dta)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("bert")
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_protein_dta(tmp_path_factory):
    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.tokenization import tape_iupac_tokenizer

    tokenizer = tape_iupac_tokenizer()
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    folder = tmp_path_factory.mktemp("protein_dta")
    DTABertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


QUICK = ["train.max_steps=8", "train.eval_steps=4", "train.batch_size=8", "data.train_limit=64", "data.eval_limit=32",
         "data.test_limit=32", "train.logging_steps=2"]  # fmt: skip


def quick_run(task, model, output_dir, *overrides):
    return finetune(load_finetune_config(task, str(model), None, [*QUICK, f"output_dir={output_dir}", *overrides]))


def run_files(run_dir):
    return {path.name for path in run_dir.iterdir()}


def saved_model_logits(run_dir, texts):
    """float64 logits of the run's saved model and tokenizer on `texts`, one padded batch."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return model(**batch).logits.double().numpy()


def first_rows(path, count, delimiter=","):
    with open(path, newline="") as handle:
        return list(
            csv.DictReader(
                handle, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
            )
        )[:count]


RUN_FILES = {"config.json", "model.safetensors", "tokenizer.json", "results.json", "metrics.csv", "dev_curve.png",
             "grid.csv", "grid.png", "run_config.yaml", "README.md"}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# End-to-end runs
# ---------------------------------------------------------------------------------------------


REMOTE_PIPELINE = without_encoderlab("""
    import json
    import sys
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
    folder, text = sys.argv[1:3]
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, trust_remote_code=True)
    print(json.dumps(classify(text)))
""")


def test_glue_sst2_run_folder_card_and_reloads(shared_data, tiny_dta, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    run_dir = tmp_path / "sst2"
    results = quick_run("sst2", tiny_dta, run_dir, f"data.path={shared_data / 'glue'}").results
    assert RUN_FILES <= run_files(run_dir)
    assert_png_drawn(run_dir / "dev_curve.png")
    assert_png_drawn(run_dir / "grid.png", min_coloured_pixels=20)  # one grid point: one marker
    assert results["label_names"] == ["negative", "positive"]
    assert results["examples"] == {"train": 64, "validation": 32}
    assert results["steps"] == 8 and results["best_step"] in (4, 8)
    # the new head is listed, under its current names
    assert {"classifier.dense.weight", "classifier.out_proj.weight"} <= set(results["initialised_weights"])
    # The reported accuracy is the saved model's on the 32 validation sentences scored.
    rows = first_rows(shared_data / "glue/SST-2/dev.tsv", 32, delimiter="\t")
    predicted = saved_model_logits(run_dir, [row["sentence"] for row in rows]).argmax(-1)
    assert results["metrics"]["validation"]["accuracy"] == pytest.approx(
        np.mean(predicted == [int(row["label"]) for row in rows])
    )

    card = ModelCard.load(run_dir / "README.md")
    assert card.data.pipeline_tag == "text-classification"
    # a local GLUE folder, capped by data.eval_limit: no Hub result is claimed, the card names the files
    assert card.data.eval_results is None and "nyu-mll/glue" not in str(card)
    assert "| validation | `SST-2/dev.tsv`: first 32 of 872 examples (data.eval_limit=32) |" in card.text
    # how much of the training split the 8 steps of 8 drew, not only how much was kept
    assert results["train_seen"] == {"seen": 64, "available": 64, "unit": "examples", "epochs": 1.0}
    assert (
        "| train | `SST-2/train.tsv`: first 64 of 67349 examples (data.train_limit=64); 64 examples drawn in "
        "training (1.00 epochs) |"
    ) in card.text

    model = AutoModelForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    text = "a charming and often affecting journey"
    local = pipeline("text-classification", model=model, tokenizer=tokenizer)(text)
    script = tmp_path / "remote.py"
    script.write_text(REMOTE_PIPELINE)
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-I", str(script), str(run_dir), text],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), done.stderr[-3000:]
    remote = json.loads(done.stdout.strip().splitlines()[-1])
    assert remote[0]["label"] == local[0]["label"] and remote[0]["score"] == pytest.approx(local[0]["score"], abs=1e-5)


def test_stsb_regression_on_a_plain_bert(shared_data, tiny_bert, tmp_path):
    from transformers import AutoModelForSequenceClassification

    results = quick_run("stsb", tiny_bert, tmp_path / "stsb", f"data.path={shared_data / 'glue'}").results
    assert results["problem_type"] == "regression" and results["label_names"] is None
    assert set(results["metrics"]["validation"]) >= {"pearson", "spearmanr"}
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "stsb")
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def test_glue_group_runs_every_task_found_and_averages_without_wnli():
    dev = {"examples": 100, "available": 100, "capped": False}
    table = glue_table(
        {"cola": {"matthews_correlation": 0.2}, "mrpc": {"f1": 0.8, "accuracy": 0.7}, "wnli": {"accuracy": 0.1}},
        {"cola": dev, "mrpc": dev, "wnli": dev},
    )
    assert "| cola | matthews_correlation 0.2000 | 100 | 20.0 |" in table
    assert "**47.5**" in table  # (20 + 75) / 2: WNLI left out


def test_secondary_structure_scores_every_residue_and_tags_with_names(shared_data, tiny_protein_dta, tmp_path):
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    from encoderlab.training.finetune.predict import tag

    run_dir = tmp_path / "ss3"
    results = quick_run(
        "secondary_structure",
        tiny_protein_dta,
        run_dir,
        f"data.path={shared_data / 'tape'}/secondary_structure",
        "data.max_length=64",
        "data.eval_limit=8",
        "data.test_limit=8",
        "data.eval_splits=[test_cb513, test_new364]",
    ).results
    assert set(results["metrics"]) == {"validation", "test_cb513", "test_new364"}
    assert results["features"]["test_cb513"] > results["examples"]["test_cb513"]  # long chains became windows
    with open(shared_data / "tape/secondary_structure/test_cb513.csv") as handle:
        rows = list(csv.DictReader(handle))[:8]
    model = AutoModelForTokenClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    # Q3 is the saved model's per-residue accuracy over every resolved residue of the 8 chains scored.
    right = counted = 0
    for row, tagged in zip(rows, tag(model, tokenizer, [row["sequence"] for row in rows]), strict=True):
        for residue, label, resolved in zip(tagged, row["ss3"], row["resolved"], strict=True):
            counted += resolved == "1"
            right += resolved == "1" and residue["label"] == label
    assert results["metrics"]["test_cb513"]["q3"] == pytest.approx(right / counted)
    assert model.config.id2label == {0: "H", 1: "E", 2: "C"}
    chain = rows[0]["sequence"][:50]
    tagged = tag(model, tokenizer, [chain])[0]
    entities = pipeline("token-classification", model=model, tokenizer=tokenizer)(chain)
    assert [t["label"] for t in tagged] == [e["entity"] for e in entities]  # same input format as the pipeline
    long_chain = max((row["sequence"] for row in rows), key=len)
    assert len(long_chain) > 62 and len(tag(model, tokenizer, [long_chain])[0]) == len(long_chain)
    # every resolved residue of the scored chains counts once: labels outside owned ranges are -100
    from encoderlab.training.finetune.tokens import TokenKind

    kind, raw_row = TokenKind(), rows[0]
    example = kind.raw_example(raw_row, "sequence", "ss3", "test", 1)
    assert sum(tag_ != "" for tag_ in example["tags"]) == raw_row["resolved"].count("1")


def test_fluorescence_regression(shared_data, tiny_protein_dta, tmp_path):
    results = quick_run(
        "fluorescence", tiny_protein_dta, tmp_path / "gfp", f"data.path={shared_data / 'tape/fluorescence'}"
    ).results
    assert results["main_metric"] == "spearmanr"
    assert set(results["metrics"]) == {"validation", "test"}
    # The test scores are the saved model's on the 32 test sequences scored.
    rows = first_rows(shared_data / "tape/fluorescence/test.csv", 32)
    predicted = saved_model_logits(tmp_path / "gfp", [row["seq"] for row in rows])[:, 0]
    labels = np.array([float(row["label"]) for row in rows])
    test = results["metrics"]["test"]
    assert test["mse"] == pytest.approx(mean_squared_error(labels, predicted), rel=1e-5)
    assert test["mse"] == pytest.approx(test["loss"], rel=1e-5)  # the regression head's loss is the MSE
    assert test["spearmanr"] == pytest.approx(spearmanr(predicted, labels).statistic, abs=1e-6)


def write_own_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "stars"])
        writer.writerows(rows)


def own_rows(count, seed):
    rng = np.random.default_rng(seed)
    words = {"good": ["great", "charming", "fine", "moving"], "bad": ["dull", "awful", "bleak", "tedious"]}
    return [(" ".join(rng.choice(words[label], 4)), label) for label in rng.choice(["good", "bad"], count)]


def test_own_csv_classification_and_predict_cli(tiny_dta, tmp_path, capsys):
    write_own_csv(tmp_path / "train.csv", own_rows(64, 0))
    write_own_csv(tmp_path / "dev.csv", own_rows(16, 1))
    run_dir = tmp_path / "own"
    results = quick_run(
        "text-classification",
        tiny_dta,
        run_dir,
        f"data.train={tmp_path / 'train.csv'}",
        f"data.validation={tmp_path / 'dev.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
    ).results
    assert results["label_names"] == ["bad", "good"]
    assert {"accuracy", "macro_f1"} <= set(results["metrics"]["validation"])
    capsys.readouterr()
    assert main(["predict", "classify", "--model", str(run_dir), "--text", "great fine", "--text", "dull"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == ["great fine", "dull"]
    assert all(line["prediction"]["label"] in ("bad", "good") for line in lines)


def test_lora_adapter_saves_reloads_and_equals_the_merged_model(shared_data, tiny_dta, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    run_dir = tmp_path / "lora"
    results = quick_run(
        "rte", tiny_dta, run_dir, f"data.path={shared_data / 'glue'}", "lora.r=4", "train.lr=1e-3"
    ).results
    assert results["lora"]["r"] == 4 and (run_dir / "adapter" / "adapter_config.json").is_file()
    assert "LoRA (rank 4" in (run_dir / "README.md").read_text()
    merged = AutoModelForSequenceClassification.from_pretrained(run_dir).eval()
    base = AutoModelForSequenceClassification.from_pretrained(tiny_dta, num_labels=2)
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_resume_after_an_interruption_equals_the_uninterrupted_run(shared_data, tiny_dta, tmp_path, monkeypatch):
    from transformers import TrainerCallback

    import encoderlab.training.finetune.point as run_module

    glue = f"data.path={shared_data / 'glue'}"
    straight = quick_run("mrpc", tiny_dta, tmp_path / "straight", glue).results

    class Interrupt(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise KeyboardInterrupt("simulated interruption after the first checkpoint")

    original = run_module.evaluate_at_end_callback
    monkeypatch.setattr(run_module, "evaluate_at_end_callback", lambda: [original(), Interrupt()][1])
    with pytest.raises(KeyboardInterrupt):
        quick_run("mrpc", tiny_dta, tmp_path / "resumed", glue)
    recorded = {"trained": 0}

    class RecordSteps(type(original())):
        """The original end-of-run callback, also noting the step the Trainer began at and the steps it trained."""

        def on_train_begin(self, args, state, control, **kwargs):
            recorded["start"] = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            recorded["trained"] += 1
            return super().on_step_end(args, state, control, **kwargs)

    monkeypatch.setattr(run_module, "evaluate_at_end_callback", RecordSteps)
    config = load_finetune_config("mrpc", str(tiny_dta), None, [*QUICK, f"output_dir={tmp_path / 'resumed'}", glue])
    resumed = finetune(config, resume=True).results
    # It went on from the checkpoint: a retrain from step 0 reaches the same weights, so they alone cannot tell.
    assert straight["steps"] > 4 and resumed["steps"] == straight["steps"]
    assert recorded == {"start": 4, "trained": straight["steps"] - 4}
    assert resumed["metrics"]["validation"]["f1"] == pytest.approx(straight["metrics"]["validation"]["f1"])
    expected = load_file(tmp_path / "straight/model.safetensors")
    actual = load_file(tmp_path / "resumed/model.safetensors")
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before anything is written
# ---------------------------------------------------------------------------------------------


BAD = [
    ("sst3", None, [], "--task='sst3' is not a registered task; allowed"),
    ("sst2", None, ["train.lrate=1"], r"Unknown key\(s\) \['train.lrate'\]"),
    ("sst2", None, ["train.lr=-1"], "train.lr=-1.0 must be > 0"),
    ("sst2", None, ["data.problem_type=regression"], "data.problem_type is for own data"),
    ("wnli", None, [], "has no WNLI/dev.tsv"),
    ("sst2", None, ["data.text_columns=[nope]"], r"lacks the column\(s\) \['nope'\]"),
    ("sst2", None, ["data.max_length=4096"], "data.max_length=4096 exceeds"),
    ("sst2", None, ["task_options.doc_stride=3"], "task_options .* given, but this task kind takes none"),
    ("sst2", "no_such_model", [], "model.path='.*no_such_model' is not a checkpoint folder"),
]


@pytest.mark.parametrize("task,model,overrides,message", BAD)
def test_bad_input_fails_before_anything_is_written(shared_data, tiny_bert, tmp_path, task, model, overrides, message):
    out = tmp_path / "run"
    model = str(tmp_path / model) if model else str(tiny_bert)
    overrides = [f"data.path={shared_data / 'glue'}", f"output_dir={out}", *overrides]
    with pytest.raises(ValueError, match=message):
        finetune(load_finetune_config(task, model, None, overrides))
    assert not out.exists()


def test_labels_outside_the_label_names_and_busy_output_dir(tiny_dta, tmp_path):
    write_own_csv(tmp_path / "train.csv", own_rows(16, 0))
    write_own_csv(tmp_path / "dev.csv", [("great", "good"), ("dull", "meh")])
    own = [
        f"data.train={tmp_path / 'train.csv'}",
        f"data.validation={tmp_path / 'dev.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
        f"output_dir={tmp_path / 'out'}",
    ]
    with pytest.raises(ValueError, match=r"label 'meh' is not one of \['bad', 'good'\].*num_labels=2"):
        finetune(load_finetune_config("text-classification", str(tiny_dta), None, own))
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty"):
        finetune(load_finetune_config("text-classification", str(tiny_dta), None, own))


def test_regression_checkpoint_refuses_a_classification_task(shared_data, tiny_bert, tmp_path):
    from transformers import AutoModelForSequenceClassification

    regression = tmp_path / "regression"
    AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, num_labels=1, problem_type="regression"
    ).save_pretrained(regression)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (regression / name).write_bytes((tiny_bert / name).read_bytes())
    with pytest.raises(ValueError, match="model.path has a regression head .* task 'sst2' is single_label"):
        finetune(
            load_finetune_config(
                "sst2", str(regression), None, [f"data.path={shared_data / 'glue'}", f"output_dir={tmp_path / 'x'}"]
            )
        )


def test_list_names_every_task_with_source_head_metric_and_cpu_default(capsys):
    assert main(["finetune", "--list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "cola",
        "stsb",
        "mnli",
        "secondary_structure",
        "fluorescence",
        "stability",
        "text-classification",
        "token-classification",
        "glue",
    ):
        assert f"\n{name} " in out
    assert "nyu-mll/glue" in out and "SequenceClassification" in out and "glue[cola]" in out
    assert "train.max_steps=300" in task_list()


def test_glue_cpu_defaults_score_the_small_dev_sets_whole(shared_data):
    """The evaluation cap keeps a split's first examples, and STS-B's dev file is ordered by genre: its head is a
    biased sample (there the gold score falls with pair length, while it rises in training). The CPU default cap
    must therefore not cut any dev set of the shipped GLUE data."""
    from encoderlab.training.finetune.data import read_table
    from encoderlab.training.finetune.tasks import get_task

    for name in ("cola", "sst2", "mrpc", "stsb", "rte"):
        task = get_task(name)
        dev = read_table(shared_data / "glue" / task.local.folder / task.local.files["validation"], task.local.columns)
        assert task.cpu_defaults["data.eval_limit"] >= len(dev), (name, len(dev))


def test_own_jsonl_multi_label_and_token_classification(tiny_dta, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    rng = np.random.default_rng(0)
    topics = {"sport": ["match", "goal"], "money": ["price", "bank"], "food": ["bread", "soup"]}

    def write(path, count):
        with open(path, "w") as handle:
            for _ in range(count):
                labels = sorted(rng.choice(list(topics), rng.integers(1, 3), replace=False).tolist())
                words = [word for label in labels for word in topics[label]]
                tags = [label for label in labels for _ in topics[label]]
                handle.write(
                    json.dumps({"text": " ".join(words), "labels": labels, "words": words, "tags": tags}) + "\n"
                )

    write(tmp_path / "train.jsonl", 48)
    write(tmp_path / "dev.jsonl", 16)
    files = [f"data.train={tmp_path / 'train.jsonl'}", f"data.validation={tmp_path / 'dev.jsonl'}"]
    multi = quick_run(
        "text-classification",
        tiny_dta,
        tmp_path / "multi",
        *files,
        "data.text_columns=[text]",
        "data.label_column=labels",
        "data.problem_type=multi_label_classification",
    ).results
    assert multi["label_names"] == ["food", "money", "sport"] and multi["main_metric"] == "micro_f1"
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "multi")
    assert model.config.problem_type == "multi_label_classification" and model.config.num_labels == 3
    tokens = quick_run(
        "token-classification",
        tiny_dta,
        tmp_path / "tokens",
        *files,
        "data.text_columns=[words]",
        "data.label_column=tags",
    ).results
    assert tokens["label_names"] == ["food", "money", "sport"]
    assert AutoModelForTokenClassification.from_pretrained(tmp_path / "tokens").config.id2label[2] == "sport"
    with pytest.raises(ValueError, match="must be a list"):
        quick_run(
            "text-classification",
            tiny_dta,
            tmp_path / "bad",
            *files,
            "data.text_columns=[text]",
            "data.label_column=words",
            "data.problem_type=multi_label_classification",
            "data.label_names=x",
        )


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_squad_card_model_index_lists_the_scores_only(version):
    """Counts (total, HasAns_total) and no-answer thresholds are not results; EM / F1 (v2: per split and at the best
    threshold) are, each once per split."""
    from encoderlab.hub_cards.card import _finetune_eval_results

    answers = {"text": ["William"], "answer_start": [0]}
    none = {"text": [], "answer_start": []}
    references = [{"id": "q1", "answers": answers}, {"id": "q2", "answers": none if version == "v2" else answers}]
    predictions = [
        {"id": "q1", "prediction_text": "William", "no_answer_score": -1.0},
        {"id": "q2", "prediction_text": "Rollo", "no_answer_score": 1.0},
    ]
    if version == "v1":
        predictions = [{key: p[key] for key in ("id", "prediction_text")} for p in predictions]
    metrics = load_metric("squad", version).compute(predictions=predictions, references=references)
    dataset, config = ("rajpurkar/squad_v2", "squad_v2") if version == "v2" else ("rajpurkar/squad", "plain_text")
    hub_split = {"origin": "hub", "name": dataset, "config": config, "hub_split": "validation", "whole_hub_split": True}
    results = {
        "pipeline_tag": "question-answering",
        "task": f"squad_{version}",
        "data": {"validation": hub_split},
        "metrics": {"validation": {**metrics, "loss": 1.0, "runtime": 0.1}},
    }
    entries = _finetune_eval_results(results)
    assert {(entry.dataset_type, entry.dataset_config) for entry in entries} == {(dataset, config)}
    listed = {entry.metric_type: entry.metric_value for entry in entries}
    expected = {"exact_match", "f1"} | (
        {"HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1"} if version == "v2" else set()
    )
    assert set(listed) == expected
    ours = {"exact_match": "exact" if version == "v2" else "exact_match"}  # the Hub's name for v2's "exact"
    assert all(listed[key] == pytest.approx(metrics[ours.get(key, key)], abs=1e-4) for key in expected)
