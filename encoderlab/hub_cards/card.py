"""Model cards (`huggingface_hub.ModelCard`) for pretraining and fine-tuning runs.

`build_model_card(record)` takes what `encoderlab pretrain` saved (``config.json``, ``results.json``,
``run_config.yaml``), read by `encoderlab.run_files.read_run_record`, and writes a card with Hub metadata (pipeline
tag ``fill-mask``) and a body: how to load the model with and without encoderlab, the architecture, training data,
tokenizer, token budget, results at the training length and the long evaluation length, limitations and the
citation of the family's paper. A fine-tuning run (``encoderlab finetune``: its results.json names a ``task``) gets
the card of `build_finetune_card`: the task's pipeline tag, ``base_model`` (a Hub id only), where each split's data
came from, the grid, the weights initialised fresh and, with LoRA, the adapter.

The bodies are Jinja templates (templates/pretraining.md, templates/finetuning.md) that
`ModelCard.from_template` fills in with the values of `_pretraining_values` and `_finetune_values`: the prose is in
the templates, each value that depends on the run (a table, a sentence that differs by case) comes from one small
function here.

A card claims only what was done. The model-index (the Hub's evaluation results) names a Hub dataset only for a
split scored whole from that dataset's split, under the Hub's metric names (`HUB_METRIC_NAMES`); local files and
capped splits are described in the text, with file names (never a machine path) and example counts. Pretraining
is scored on held-out documents of the corpus, never a Hub split, so its card has no model-index.
`validate_model_card` checks a card offline; `ModelCard.validate` asks the Hub.
"""

from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..configuration.choices import pair_encoding
from ..run_files import RunRecord, is_local_path, public_name

PAPERS = {
    "dta_bert": {
        "title": "Dual Triangle Attention: Effective Bidirectional Attention Without Positional Embeddings",
        "arxiv": "2604.18603",
        "key": "dta2026",
    },
    "homa": {
        "title": "Higher-Order Modular Attention: Fusing Pairwise and Triadic Interactions for Protein Sequences",
        "authors": "Amiraslani, Shirin and Gao, Xin",
        "key": "homa",
    },
    "dstg_neobert": {
        "title": "Give it Space! Explicit Disentangling of Positional and Semantic Representations in Encoders",
        "authors": "Lequeu, Pierre-Antoine and Barboule, Camille and Piwowarski, Benjamin",
        "key": "dstg",
    },
}
"""Family (``model_type``) -> the paper cited in its cards."""

ARCHITECTURE_FIELDS = (
    "attention_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "mlp_type",
    "norm_type", "position_embedding_type", "use_positions", "max_position_embeddings", "unet", "value_embeddings",
    "vocab_size",
)  # fmt: skip
"""config.json fields shown in the architecture table, where the family has them."""

TEMPLATES = Path(__file__).parent / "templates"
"""The Jinja templates of the card bodies (`ModelCard.from_template`), shipped with the package."""
LENGTHS = ("short", "long")
PACKING_WORDS = {
    "pack": "documents packed into rows of exactly",
    "chunk": "windows of at most",
    "truncate": "the first window of each document, at most",
}
"""How the card words each ``data.packing`` (`encoderlab.training.run_config.PACKING_MODES`)."""
REQUIRED_METADATA = ("pipeline_tag", "library_name", "license")
PIPELINE_TAGS = ("fill-mask", "text-classification", "token-classification", "question-answering")
"""Pipeline tags of the cards built here (pretraining: fill-mask; fine-tuning: per task kind)."""
NOT_METRICS = (
    "loss",
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "epoch",
    "model_preparation_time",
    "num_input_tokens_seen",
)
"""Trainer evaluation keys that are not task metrics (kept out of the model-index)."""
HUB_METRIC_NAMES = {"exact": "exact_match", "pearson": "pearsonr"}
"""Our metric key -> the Hub's metric id where they differ (SQuAD v2's ``exact`` is ``exact_match``, GLUE STS-B's
``pearson`` is ``pearsonr``); ``f1``, ``accuracy``, ``matthews_correlation``, ``spearmanr`` are the same."""


def _dataset_name(run: dict) -> str:
    source = run["data"]["source"]
    if source == "embedded":
        return "pydoc_data.topics (Python's English reference text)"
    return f"local data `{public_name(source)}`" if is_local_path(source) else f"Hub dataset `{source}`"


def _table(rows: list[tuple]) -> str:
    header, *body = rows
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in body]
    return "\n".join(lines)


def _citation(family: str) -> str:
    paper = PAPERS.get(family)
    if paper is None:
        return "No paper is registered for this family."
    fields = [f"  title = {{{paper['title']}}}"]
    if "authors" in paper:
        fields.append(f"  author = {{{paper['authors']}}}")
    if "arxiv" in paper:
        fields += [f"  journal = {{arXiv preprint arXiv:{paper['arxiv']}}}", f"  eprint = {{{paper['arxiv']}}}"]
    link = f" ([arXiv:{paper['arxiv']}](https://arxiv.org/abs/{paper['arxiv']}))" if "arxiv" in paper else ""
    return f"*{paper['title']}*{link}\n\n```bibtex\n@article{{{paper['key']},\n" + ",\n".join(fields) + "\n}\n```"


def _lengths(results: dict) -> tuple[int, int, int]:
    """(training length, long evaluation length, long factor) of a pretraining run: results.json's ``lengths``, or,
    in a run that wrote none, its ``seq_len`` and ``long_len`` (the long length is the training length times a whole
    factor, ``data.long_factor``)."""
    if "lengths" in results:
        lengths = results["lengths"]
        return lengths["seq_len"], lengths["long_seq_len"], lengths["long_factor"]
    return results["seq_len"], results["long_len"], results["long_len"] // results["seq_len"]


def _mlm_rows(results: dict) -> list[tuple]:
    """The Results table of a pretraining run: each split at both lengths; the test split also with the unigram
    baseline and the copy-or-unigram floor ("missing" in the results of a run from before the floor)."""
    seq_len, long_len, _ = _lengths(results)
    tokens = {"short": seq_len, "long": long_len}
    floor = results.get("copy_or_unigram_floor", {})
    rows = [
        (
            "split",
            "length (tokens)",
            "mlm_loss",
            "accuracy",
            "micro-F1",
            "MCC",
            "unigram baseline acc.",
            "copy-or-unigram floor acc.",
        )
    ]
    for split in ("validation", "test"):
        for length in LENGTHS:
            scores = [f"{results[split][length][metric]:.4f}" for metric in ("mlm_loss", "accuracy", "micro_f1", "mcc")]
            references = ["", ""]
            if split == "test":
                references = [
                    f"{results['unigram_baseline'][length]:.4f}",
                    f"{floor[length]:.4f}" if length in floor else "missing",
                ]
            rows.append((split, tokens[length], *scores, *references))
    return rows


def _drope_text(results: dict) -> str:
    if results.get("drope_step") is None:
        return "no DroPE switch"
    return f"positions switched off (DroPE) from optimizer step {results['drope_step']}"


def _pretraining_values(record: RunRecord, model_name: str, repo_id: str) -> dict:
    """What templates/pretraining.md fills in."""
    config, results, run = record.config, record.results, record.run
    seq_len, long_len, long_factor = _lengths(results)
    tokenizer, packing = run["tokenizer"], run["data"]["packing"]
    return {
        "model_name": model_name, "repo_id": repo_id, "family": config["model_type"],
        "architecture": _table([("field", "value")] + [(name, config[name]) for name in ARCHITECTURE_FIELDS
                                                       if name in config]),
        "dataset": _dataset_name(run), "documents": results["documents"], "train": run["train"],
        "packing": packing, "packing_words": PACKING_WORDS.get(packing, "windows of at most"),
        "seq_len": seq_len, "long_len": long_len, "long_factor": long_factor,
        "tokenizer_name": public_name(tokenizer["path"]) if tokenizer["path"] else tokenizer["name"],
        "vocab_size": config["vocab_size"], "mlm": run["mlm"], "plan": results["plan"],
        "tokens_seen": results["tokens_seen"], "optimizer": run["optimizer"], "drope": _drope_text(results),
        "unigram_token": results["unigram_baseline"]["token"], "results_table": _table(_mlm_rows(results)),
        "citation": _citation(config["model_type"]),
    }  # fmt: skip


def build_model_card(record: RunRecord, repo_id: str | None = None, license: str = "apache-2.0") -> ModelCard:
    """The model card of a finished run, from its `record` (`encoderlab.run_files.read_run_record`); `repo_id` is
    used in the loading snippets."""
    if "task" in record.results:
        return build_finetune_card(record, repo_id, license)
    model_name = repo_id.split("/")[-1] if repo_id else record.name
    source = record.run["data"]["source"]
    data = ModelCardData(
        model_name=model_name,
        pipeline_tag="fill-mask",
        library_name="transformers",
        license=license,
        tags=["encoderlab", record.config["model_type"], "masked-lm", "fill-mask"],
        datasets=[source] if source != "embedded" and not is_local_path(source) else None,
    )
    values = _pretraining_values(record, model_name, repo_id or record.folder)
    return ModelCard.from_template(data, template_path=TEMPLATES / "pretraining.md", **values)


def validate_model_card(card: ModelCard | str | Path) -> ModelCard:
    """Offline validation: the card parses back, has the required metadata and, where it has a model-index,
    well-formed eval results.

    Raises:
        ValueError: naming what is missing or malformed.
    """
    card = card if isinstance(card, ModelCard) else ModelCard.load(card)
    reparsed = ModelCard(str(card))  # the text as the Hub would read it
    metadata = reparsed.data.to_dict()
    missing = [key for key in REQUIRED_METADATA if not metadata.get(key)]
    if missing:
        raise ValueError(f"Model card metadata lacks {missing}")
    if metadata["pipeline_tag"] not in PIPELINE_TAGS:
        raise ValueError(f"Model card pipeline_tag={metadata['pipeline_tag']!r}; expected one of {list(PIPELINE_TAGS)}")
    if metadata.get("model-index"):
        results = reparsed.data.eval_results or []
        if not results or any(not isinstance(r.metric_value, (int, float)) for r in results):
            raise ValueError("Model card model-index must hold numeric evaluation results")
    if not reparsed.text.strip():
        raise ValueError("Model card has no body text")
    return reparsed


# ---------------------------------------------------------------------------------------------
# Fine-tuned runs
# ---------------------------------------------------------------------------------------------

AUTO_CLASS_OF_TAG = {
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
}


def _task_metrics(metrics: dict) -> dict:
    return {
        key: value
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in NOT_METRICS
    }


def _is_score(metric: str) -> bool:
    """Whether a task metric is a score the model-index should list: not a count of examples (SQuAD's ``total``,
    ``HasAns_total``) nor a no-answer threshold (``best_f1_thresh``), which the card's Results table still shows."""
    return not (metric == "total" or metric.endswith(("_total", "_thresh")))


def _finetune_eval_results(results: dict) -> list[EvalResult]:
    """One model-index entry per score of each evaluation split that is a whole Hub split (results.json ``data``:
    ``whole_hub_split``), named by the Hub's metric ids; a split of local files or a capped one gets none."""
    entries = []
    for split, metrics in results["metrics"].items():
        source = results.get("data", {}).get(split)
        if not source or not source["whole_hub_split"]:
            continue
        for metric, value in _task_metrics(metrics).items():
            if not _is_score(metric):
                continue
            metric_type = HUB_METRIC_NAMES.get(metric, metric)
            entries.append(EvalResult(
                task_type=results["pipeline_tag"], task_name=results["task"], dataset_type=source["name"],
                dataset_name=source["name"] + (f" ({source['config']})" if source["config"] else ""),
                dataset_config=source["config"], dataset_split=source["hub_split"], metric_type=metric_type,
                metric_name=f"{split} {metric_type}", metric_value=round(float(value), 4),
            ))  # fmt: skip
    return entries


def _source_text(source: dict, unit: str) -> str:
    """One split's data as the card tells it: the Hub split or the file (and SQuAD article slice), and how many
    of its examples were used."""
    if source["origin"] == "hub":
        where = f"Hub dataset `{source['name']}`" + (f" (config `{source['config']}`)" if source["config"] else "")
        where += f", split `{source['hub_split']}`"
    else:
        where = f"`{source['name']}`" + (f" articles [{source['articles']}]" if source["articles"] else "")
    skipped = source.get("skipped_lines") or []
    left_out = (
        (
            f"; {len(skipped)} record(s) whose number of fields differs from the header's left out (line(s) "
            f"{', '.join(map(str, skipped[:10]))}{' ...' if len(skipped) > 10 else ''}; "
            "`data.skip_malformed_rows`)"
        )
        if skipped
        else ""
    )
    if source["capped"]:
        return (
            f"{where}: first {source['examples']} of {source['available'] - len(skipped)} {unit} "
            f"({source['limit_key']}={source['limit']}){left_out}"
        )
    return f"{where}: all {source['examples']} {unit}{left_out}"


def _residue_text(results: dict) -> str:
    """What the residue check of a protein run let through (`encoderlab.tokenization.residues`), where anything."""
    notes = [
        f"`{split}`: {counts['unknown_characters']} character(s) outside the tokenizer's residue alphabet in "
        f"{counts['unknown_records']} of {counts['records']} sequences, read as the unknown token "
        f"(`data.unknown_residues=allow`); {counts['lowercase_records']} sequence(s) with lowercase letters, "
        "read as uppercase"
        for split, counts in (results.get("residues") or {}).items()
        if counts["unknown_characters"] or counts["lowercase_records"]
    ]
    return "\n\nThe residue check: " + "; ".join(notes) + "." if notes else ""


def _data_section(results: dict) -> str:
    """The Data section: every split's source and counts, and which results (if any) the model-index claims."""
    data = results.get("data", {})
    unit = "questions" if results["pipeline_tag"] == "question-answering" else "examples"
    rows = [("split", "data")] + [
        (split, _source_text(source, unit) + (_seen_text(results) if split == "train" else ""))
        for split, source in data.items()
    ]
    claimed = [split for split in results["metrics"] if data.get(split, {}).get("whole_hub_split")]
    if claimed:
        claim = (
            f"The model-index lists the results of {', '.join(f'`{s}`' for s in claimed)}: whole splits of a "
            "Hub dataset."
        )
        if len(claimed) < len(results["metrics"]):
            claim += " The other evaluation splits are local files or capped: their results are below only."
    else:
        claim = (
            "No result on a Hub dataset is claimed: no evaluation split is a whole split of a Hub dataset "
            "(local files, or capped), so the results below hold for these examples only."
        )
    return f"{_table(rows)}\n\n{claim}{_residue_text(results)}"


def _output_text(results: dict) -> str:
    if results["pipeline_tag"] == "question-answering":
        no_answer = (
            ", or no answer when the no-answer score exceeds the saved threshold `qa_null_threshold`"
            if results.get("metric_config") == "v2"
            else ""
        )
        return f"Output: an answer span copied from the context{no_answer}."
    if results["problem_type"] == "regression":
        return "Output: a single score (regression)."
    return f"Labels: {results['label_names']}."


def _base_model_text(results: dict) -> str:
    base = results.get("base_checkpoint", results.get("base_model"))
    if results.get("base_model"):
        return f"`{base}`"
    return f"`{base}` (no `base_model` in the metadata: {results.get('base_model_note')})"


def _layer_decay_text(train: dict) -> str:
    decay = train.get("layerwise_lr_decay", 1.0)
    if decay == 1.0:
        return "One learning rate for every layer."
    return (
        f"Layer-wise learning-rate decay {decay:g}: the head at the grid point's rate, each layer below at "
        f"{decay:g} x the rate of the one above, the embeddings lowest."
    )


def _pair_text(config: dict) -> str:
    if pair_encoding(config) != "separate":
        return ""
    return (
        "\n- Pairs encoded separately (`classifier_pair_encoding: separate`, a bi-encoder): each text alone, "
        "mean-pooled into u and v, the head on [u, v, |u - v|, u * v]; the tokenizer writes a pair as each text "
        "alone, `[CLS] a [SEP] [CLS] b [SEP]`."
    )


def _metric_rows(results: dict) -> list[tuple]:
    """The Results table: each split's metrics, with the baseline's value beside each where the task has one."""
    baseline = results.get("baseline")
    header = ("split", "metric", "value") + ((f"baseline ({baseline['name']})",) if baseline else ())
    rows = [header]
    for split, metrics in results["metrics"].items():
        rule = baseline["metrics"].get(split, {}) if baseline else None
        for metric, value in _task_metrics(metrics).items():
            cell = () if rule is None else (f"{rule[metric]:.4f}" if metric in rule else "",)
            rows.append((split, metric, f"{value:.4f}", *cell))
    return rows


def _baseline_text(results: dict) -> str:
    baseline = results.get("baseline")
    if not baseline:
        return ""
    main = results["main_metric"]
    margins = ", ".join(
        f"{split} {metrics[main] - baseline['metrics'][split][main]:+.2f}"
        for split, metrics in results["metrics"].items()
        if split in baseline["metrics"]
    )
    return (
        f"The baseline column scores the rule *{baseline['name']}* on the same examples; a model at or below it "
        f"has learned nothing that rule does not know. The model's `{main}` minus the baseline's: {margins}.\n\n"
    )


def _best_checkpoint_text(results: dict) -> str:
    epoch = results.get("best_epoch")
    return f"step {results['best_step']}" + ("" if epoch is None else f", epoch {epoch:.2f}")


def _seen_text(results: dict) -> str:
    """How much of the training split training drew, e.g. "9,600 examples drawn in training (0.14 epochs)"."""
    seen = results.get("train_seen") or {}
    if seen.get("seen") is None:
        return ""
    unit = "" if seen["unit"] == "examples" else f" of its {seen['available']:,} {seen['unit']}"
    return f"; {seen['seen']:,} {seen['unit']} drawn in training ({seen['epochs']:.2f} epochs{unit})"


def _num_labels(config: dict) -> int:
    """The number of labels of a task model's config.json (its ``id2label``; a regression head has one)."""
    return len(config.get("id2label") or {}) or 1


def _finetune_values(record: RunRecord, model_name: str, repo_id: str) -> dict:
    """What templates/finetuning.md fills in."""
    config, results, run = record.config, record.results, record.run
    grid = results["grid"]
    return {
        "model_name": model_name, "repo_id": repo_id, "family": config["model_type"], "task": results["task"],
        "problem_type": results["problem_type"], "pipeline_tag": results["pipeline_tag"],
        "auto_class": AUTO_CLASS_OF_TAG[results["pipeline_tag"]], "base_model": _base_model_text(results),
        "remote_code": "auto_map" in config, "output": _output_text(results), "data_section": _data_section(results),
        "max_length": results.get("max_length", {}).get("tokens", run["data"]["max_length"]),
        "pair_encoding": _pair_text(config), "best_point": results["best_point"], "steps": results["steps"],
        "best_checkpoint": _best_checkpoint_text(results), "main_metric": results["main_metric"],
        "eval_steps": results["eval_steps"],
        "initialised": ", ".join(f"`{name}`" for name in results["initialised_weights"]) or "none",
        "layer_decay": _layer_decay_text(run["train"]), "lora": results.get("lora"),
        "lora_base": results.get("base_model") or "BASE_CHECKPOINT", "num_labels": _num_labels(config),
        "grid_table": _table([tuple(grid[0])] + [tuple(point.values()) for point in grid]),
        "baseline": _baseline_text(results), "metrics_table": _table(_metric_rows(results)),
        "citation": _citation(config["model_type"]),
    }  # fmt: skip


def build_finetune_card(record: RunRecord, repo_id: str | None = None, license: str = "apache-2.0") -> ModelCard:
    """The model card of a finished ``encoderlab finetune`` run, from its `record`."""
    config, results = record.config, record.results
    model_name = repo_id.split("/")[-1] if repo_id else record.name
    tags = ["encoderlab", config["model_type"], results["task"]] + (["lora", "peft"] if results.get("lora") else [])
    data = ModelCardData(
        model_name=model_name,
        pipeline_tag=results["pipeline_tag"],
        library_name="transformers",
        license=license,
        base_model=results.get("base_model") if "base_checkpoint" in results else None,
        tags=tags,
        datasets=sorted({source["name"] for source in results.get("data", {}).values() if source["origin"] == "hub"})
        or None,
        eval_results=_finetune_eval_results(results) or None,  # an empty list would write an empty model-index
    )
    values = _finetune_values(record, model_name, repo_id or record.folder)
    return ModelCard.from_template(data, template_path=TEMPLATES / "finetuning.md", **values)
