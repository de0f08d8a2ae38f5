"""Model cards (`huggingface_hub.ModelCard`) for pretraining and fine-tuning runs.

`build_model_card(record)` takes what `encoderlab pretrain` saved (``config.json``, ``results.json``,
``run_config.yaml``), read by `encoderlab.run_files.read_run_record`, and writes a card with Hub metadata (pipeline tag ``fill-mask``) and a body:
how to load the model with and without encoderlab, the architecture, training data, tokenizer, token budget,
results at 1x and 4x the training length, limitations and the citation of the family's paper. A fine-tuning run
(``encoderlab finetune``: its results.json names a ``task``) gets the card of `build_finetune_card`: the task's
pipeline tag, ``base_model`` (a Hub id only), where each split's data came from, the grid, the weights initialised
fresh and, with LoRA, the adapter.

A card claims only what was done. The model-index (the Hub's evaluation results) names a Hub dataset only for a
split scored whole from that dataset's split, under the Hub's metric names (`HUB_METRIC_NAMES`); local files and
capped splits are described in the text, with file names (never a machine path) and example counts. Pretraining
is scored on held-out documents of the corpus, never a Hub split, so its card has no model-index.
`validate_model_card` checks a card offline; `ModelCard.validate` asks the Hub.
"""

import json
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

LENGTHS = ("short", "long")
PACKING_WORDS = {"pack": "documents packed into rows of exactly", "chunk": "windows of at most",
                 "truncate": "the first window of each document, at most"}
"""How the card words each ``data.packing`` (`encoderlab.training.run_config.PACKING_MODES`)."""
REQUIRED_METADATA = ("pipeline_tag", "library_name", "license")
PIPELINE_TAGS = ("fill-mask", "text-classification", "token-classification", "question-answering")
"""Pipeline tags of the cards built here (pretraining: fill-mask; fine-tuning: per task kind)."""
NOT_METRICS = ("loss", "runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time",
               "num_input_tokens_seen")
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


def _body(model_name: str, config: dict, results: dict, run: dict, repo_id: str) -> str:
    family = config["model_type"]
    architecture = _table(
        [("field", "value")] + [(name, config[name]) for name in ARCHITECTURE_FIELDS if name in config]
    )
    results_rows = [("split", "length (tokens)", "mlm_loss", "accuracy", "micro-F1", "MCC", "unigram baseline acc.",
                     "copy-or-unigram floor acc.")]
    floor = results.get("copy_or_unigram_floor", {})  # absent from the results of runs from before the floor
    for split in ("validation", "test"):
        for length in LENGTHS:
            m = results[split][length]
            tokens = results["seq_len"] if length == "short" else results["long_len"]
            baseline = f"{results['unigram_baseline'][length]:.4f}" if split == "test" else ""
            floor_cell = (f"{floor[length]:.4f}" if length in floor else "missing") if split == "test" else ""
            results_rows.append(
                (split, tokens, f"{m['mlm_loss']:.4f}", f"{m['accuracy']:.4f}", f"{m['micro_f1']:.4f}",
                 f"{m['mcc']:.4f}", baseline, floor_cell)
            )  # fmt: skip
    plan, train, tokenizer = results["plan"], run["train"], run["tokenizer"]
    tokenizer_name = public_name(tokenizer["path"]) if tokenizer["path"] else tokenizer["name"]
    drope = (
        f"positions switched off (DroPE) from optimizer step {results['drope_step']}"
        if results.get("drope_step") is not None
        else "no DroPE switch"
    )
    return f"""
# {model_name}

A `{family}` encoder pretrained with masked language modelling by
encoderlab (`encoderlab pretrain`).

## How to load

With encoderlab installed (`pip install encoderlab`), importing it registers the family:

```python
import encoderlab  # registers {family} with the transformers Auto classes
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

model = AutoModelForMaskedLM.from_pretrained("{repo_id}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
```

Without encoderlab, the checkpoint carries its own modelling code:

```python
from transformers import AutoModelForMaskedLM, AutoTokenizer

# trust_remote_code for both: config.json names the checkpoint's own classes
model = AutoModelForMaskedLM.from_pretrained("{repo_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
```

## Architecture

{architecture}

## Training data

- Source: {_dataset_name(run)}; documents split by document (no document in two splits):
  {results['documents']['train']} train, {results['documents']['validation']} validation,
  {results['documents']['test']} test documents (split seed {train['seed']}).
- Training examples: {PACKING_WORDS.get(run['data']['packing'], 'windows of at most')} {results['seq_len']} tokens \
(`{run['data']['packing']}` packing).
- Evaluation: the validation and test documents with at least {results['long_len']} tokens, cut into windows of
  {results['seq_len']} ("short", 1x) and {results['long_len']} ("long", 4x) tokens, masked once with a fixed seed.

## Tokenizer

`{tokenizer_name}` with {config['vocab_size']} tokens (saved with the model; loads with
`AutoTokenizer`). Masking: {run['mlm']['probability']:.0%} of non-special tokens,
{run['mlm']['mask_replace_prob']:.0%} replaced by the mask token, {run['mlm']['random_replace_prob']:.0%} by a
random token.

## Training

- Token budget: {plan['token_budget']:,} non-padding tokens -> {plan['max_steps']} optimizer steps of
  {plan['examples_per_step']} examples; actually trained on **{results['tokens_seen']:,}** non-padding tokens
  ({plan['epochs']:.1f} epochs of the training split).
- Optimizer: `{run['optimizer']['name']}` (AdamW lr {run['optimizer']['lr']}, Muon lr {run['optimizer']['muon_lr']}
  where used); schedule `{train['schedule']}` (warmup {train['warmup_fraction']:.0%},
  cooldown {train['cooldown_fraction']:.0%}); {drope}.
- Sequence length {results['seq_len']}, {train['batch_size']} examples per device, seed {train['seed']}.

## Results

Masked-token metrics (over masked positions only) on this run's held-out documents (no Hub dataset split);
micro-F1 equals accuracy for single-label prediction.
The unigram baseline always predicts the most frequent training token
(`{results['unigram_baseline']['token']}`). The copy-or-unigram floor, on the same test masks as the model,
copies every input token that is not the mask token (kept tokens are then right) and predicts that most
frequent token at the mask tokens; a model at or below it does no better than that rule.

{_table(results_rows)}

![training curves](training_curves.png)

## Limitations

- Evaluated only by masked-token prediction on held-out documents of the pretraining corpus; no downstream task.
- Small runs (such as the demo) see a tiny corpus for many epochs: expect memorised phrasing and weak transfer.
- The model only knows the language/alphabet of its tokenizer and corpus and inherits the corpus' biases.

## Citation

{_citation(family)}
"""


def build_model_card(record: RunRecord, repo_id: str | None = None, license: str = "apache-2.0") -> ModelCard:
    """The model card of a finished run, from its `record` (`encoderlab.run_files.read_run_record`); `repo_id` is
    used in the loading snippets."""
    config, results, run = record.config, record.results, record.run
    if "task" in results:
        return build_finetune_card(record, repo_id, license)
    model_name = repo_id.split("/")[-1] if repo_id else record.name
    source = run["data"]["source"]
    data = ModelCardData(
        model_name=model_name,
        pipeline_tag="fill-mask",
        library_name="transformers",
        license=license,
        tags=["encoderlab", config["model_type"], "masked-lm", "fill-mask"],
        datasets=[source] if source != "embedded" and not is_local_path(source) else None,
    )
    body = _body(model_name, config, results, run, repo_id or record.folder)
    return ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n" + body)


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
        raise ValueError(
            f"Model card pipeline_tag={metadata['pipeline_tag']!r}; expected one of {list(PIPELINE_TAGS)}"
        )
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
    return {key: value for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in NOT_METRICS}


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
    left_out = (f"; {len(skipped)} record(s) whose number of fields differs from the header's left out (line(s) "
                f"{', '.join(map(str, skipped[:10]))}{' ...' if len(skipped) > 10 else ''}; "
                "`data.skip_malformed_rows`)") if skipped else ""
    if source["capped"]:
        return (f"{where}: first {source['examples']} of {source['available'] - len(skipped)} {unit} "
                f"({source['limit_key']}={source['limit']}){left_out}")
    return f"{where}: all {source['examples']} {unit}{left_out}"


def _residue_text(results: dict) -> str:
    """What the residue check of a protein run let through (`encoderlab.tokenization.residues`), where anything."""
    notes = [f"`{split}`: {counts['unknown_characters']} character(s) outside the tokenizer's residue alphabet in "
             f"{counts['unknown_records']} of {counts['records']} sequences, read as the unknown token "
             f"(`data.unknown_residues=allow`); {counts['lowercase_records']} sequence(s) with lowercase letters, "
             "read as uppercase" for split, counts in (results.get("residues") or {}).items()
             if counts["unknown_characters"] or counts["lowercase_records"]]
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
        claim = (f"The model-index lists the results of {', '.join(f'`{s}`' for s in claimed)}: whole splits of a "
                 "Hub dataset.")
        if len(claimed) < len(results["metrics"]):
            claim += " The other evaluation splits are local files or capped: their results are below only."
    else:
        claim = ("No result on a Hub dataset is claimed: no evaluation split is a whole split of a Hub dataset "
                 "(local files, or capped), so the results below hold for these examples only.")
    return f"{_table(rows)}\n\n{claim}{_residue_text(results)}"


def _output_text(results: dict) -> str:
    if results["pipeline_tag"] == "question-answering":
        no_answer = (", or no answer when the no-answer score exceeds the saved threshold `qa_null_threshold`"
                     if results.get("metric_config") == "v2" else "")
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
    return (f"Layer-wise learning-rate decay {decay:g}: the head at the grid point's rate, each layer below at "
            f"{decay:g} x the rate of the one above, the embeddings lowest.")


def _pair_text(config: dict) -> str:
    if pair_encoding(config) != "separate":
        return ""
    return ("\n- Pairs encoded separately (`classifier_pair_encoding: separate`, a bi-encoder): each text alone, "
            "mean-pooled into u and v, the head on [u, v, |u - v|, u * v]; the tokenizer writes a pair as each text "
            "alone, `[CLS] a [SEP] [CLS] b [SEP]`.")


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
    margins = ", ".join(f"{split} {metrics[main] - baseline['metrics'][split][main]:+.2f}"
                        for split, metrics in results["metrics"].items() if split in baseline["metrics"])
    return (f"The baseline column scores the rule *{baseline['name']}* on the same examples; a model at or below it "
            f"has learned nothing that rule does not know. The model's `{main}` minus the baseline's: {margins}.\n\n")


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


def _finetune_body(model_name: str, config: dict, results: dict, run: dict, repo_id: str) -> str:
    tag, family = results["pipeline_tag"], config["model_type"]
    auto_class = AUTO_CLASS_OF_TAG[tag]
    metric_rows = _metric_rows(results)
    grid_rows = [tuple(results["grid"][0])] + [tuple(point.values()) for point in results["grid"]]
    initialised = ", ".join(f"`{name}`" for name in results["initialised_weights"]) or "none"
    pipeline_snippet = (f'classify = pipeline("{tag}", model=model, tokenizer=tokenizer)'
                        if tag != "question-answering" else
                        "# transformers 5 has no extractive QA pipeline: use `encoderlab predict qa` or\n"
                        "# encoderlab.training.finetune.predict_qa.answer_questions")
    remote_code = "" if "auto_map" not in config else (
        f'Without encoderlab: `{auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)` (and the same '
        "for `AutoTokenizer`): the checkpoint carries its modelling code.\n\n"
    )
    lora = results.get("lora")
    lora_text = "Full fine-tuning: every weight was trained."
    if lora:
        lora_text = f"""LoRA (rank {lora['r']}, alpha {lora['alpha']}, dropout {lora['dropout']}) on the encoder's
linear layers through `peft`, with the task head trained in full. The weights in this repository are the adapter merged
into the base model (they load without `peft`); the adapter alone is in `adapter/`:

```python
from peft import PeftModel
from transformers import {auto_class}

base = {auto_class}.from_pretrained("{results.get('base_model') or 'BASE_CHECKPOINT'}", \
num_labels={config.get('num_labels', 1)})
model = PeftModel.from_pretrained(base, "{repo_id}", subfolder="adapter")
```"""
    return f"""
# {model_name}

{_base_model_text(results)} (a `{family}` encoder) fine-tuned on **{results['task']}**
({results['problem_type']}) with `encoderlab finetune`.

## How to use

```python
import encoderlab  # registers {family} with the transformers Auto classes (skip it for transformers' own families)
from transformers import {auto_class}, AutoTokenizer, pipeline

model = {auto_class}.from_pretrained("{repo_id}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
{pipeline_snippet}
```

{remote_code}{_output_text(results)}

## Data

{_data_section(results)}

## Training

- Task: `{results['task']}`; examples per split as in Data above.
- Inputs: at most {results.get('max_length', {}).get('tokens', run['data']['max_length'])} tokens with the
  tokenizer's special tokens, as the pipeline encodes them.{_pair_text(config)}
- Best grid point: {results['best_point']}; {results['steps']} optimizer steps, best checkpoint at
  {_best_checkpoint_text(results)} (validation `{results['main_metric']}`, evaluated every {results['eval_steps']}
  steps); the results below are that checkpoint's.
- Weights initialised fresh (not in the base checkpoint): {initialised}.
- {_layer_decay_text(run['train'])}
- {lora_text}

Every grid point (validation `{results['main_metric']}`):

{_table(grid_rows)}

## Results

{_baseline_text(results)}{_table(metric_rows)}

![dev curve](dev_curve.png)

## Limitations

- Scores are on the splits listed above only; small CPU-budget runs are far from converged.
- The model inherits the biases of its pretraining corpus and of the fine-tuning data.

## Citation

{_citation(family)}
"""


def build_finetune_card(record: RunRecord, repo_id: str | None = None, license: str = "apache-2.0") -> ModelCard:
    """The model card of a finished ``encoderlab finetune`` run, from its `record`."""
    config, results, run = record.config, record.results, record.run
    model_name = repo_id.split("/")[-1] if repo_id else record.name
    tags = ["encoderlab", config["model_type"], results["task"]] + (["lora", "peft"] if results.get("lora") else [])
    data = ModelCardData(
        model_name=model_name,
        pipeline_tag=results["pipeline_tag"],
        library_name="transformers",
        license=license,
        base_model=results.get("base_model") if "base_checkpoint" in results else None,
        tags=tags,
        datasets=sorted({source["name"] for source in results.get("data", {}).values()
                         if source["origin"] == "hub"}) or None,
        eval_results=_finetune_eval_results(results) or None,  # an empty list would write an empty model-index
    )
    body = _finetune_body(model_name, config, results, run, repo_id or record.folder)
    return ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n" + body)
