"""Every family works with the tools people use around a transformers encoder: PEFT LoRA, sentence-transformers
(with encoderlab installed and through the checkpoint's own code without it), gradient checkpointing, and the
``fill-mask``, ``feature-extraction``, ``text-classification`` and ``token-classification`` pipelines.

Each family is one tiny preset that exercises what is its own: DTA-BERT with the U-Net body and value embeddings,
HOMA with fused pairwise + triadic attention, DSTG-NeoBERT with its two streams.
"""

import subprocess
import sys

import pytest
import torch
from remote_code import without_encoderlab
from transformers import AutoModel, AutoModelForMaskedLM, pipeline

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
    DTABertConfig,
    DTABertForMaskedLM,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    HOMAConfig,
    HOMAForMaskedLM,
    HOMAForSequenceClassification,
    HOMAForTokenClassification,
)
from encoderlab.modeling.base import masked_mean

MLM, SEQUENCE, TOKEN = range(3)  # index of the task model in FAMILIES
SIZES = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
FAMILIES = {
    "dta": (
        DTABertConfig,
        dict(SIZES, hidden_size=16, position_embedding_type="rope", unet=True, value_embeddings=True),
        (DTABertForMaskedLM, DTABertForSequenceClassification, DTABertForTokenClassification),
    ),
    "homa": (
        HOMAConfig,
        dict(
            SIZES,
            hidden_size=16,
            attention_type="homa",
            block_size=6,
            block_stride=4,
            triadic_window=3,
            u_rank=4,
            fusion_hidden_size=8,
        ),
        (HOMAForMaskedLM, HOMAForSequenceClassification, HOMAForTokenClassification),
    ),
    "dstg": (
        DSTGNeoBERTConfig,
        dict(
            SIZES,
            preset="dstg",
            hidden_size=32,
            ap_size=8,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=8,
        ),
        (DSTGNeoBERTForMaskedLM, DSTGNeoBERTForSequenceClassification, DSTGNeoBERTForTokenClassification),
    ),
}
# LoRA targets by module name (README "Works with"): the attention projections and the MLP of every layer.
LORA_TARGETS = {
    "dta": ["qkv", "out_proj", "gate_up", "down"],
    "homa": ["query", "key", "value", "output"],
    "dstg": ["semantic_qkv", "ap_qkv", "semantic_out", "ap_out", "gate_up", "semantic_down", "ap_down"],
}
SEQUENCE_LABELS = {0: "negative", 1: "positive", 2: "neutral"}
TOKEN_LABELS = {0: "H", 1: "E", 2: "C"}
SENTENCES = ["the value of an object is returned", "a list", "if the name is not found, an exception is raised"]


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece tokenizer trained on Python's own help texts (as tests/test_finetune.py builds one)."""
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    return build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=300, model_max_length=64)


def build(family, task, tokenizer, **overrides):
    """A family model for ``task`` (MLM, SEQUENCE or TOKEN) sized to ``tokenizer``,
    with weights drawn wider than the default init so outputs are far from uniform."""
    config_class, settings, model_classes = FAMILIES[family]
    token_ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if family == "dstg":
        token_ids.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    torch.manual_seed(0)
    model = model_classes[task](config_class(**settings, **token_ids, **overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer):
    """{family: {"mlm" | "sequence" | "token": folder}}: saved models, each with the tokenizer beside it."""
    root = tmp_path_factory.mktemp("checkpoints")
    folders = {}
    for family in FAMILIES:
        tasks = {
            "mlm": (MLM, {}),
            "sequence": (SEQUENCE, dict(id2label=SEQUENCE_LABELS)),
            "token": (TOKEN, dict(id2label=TOKEN_LABELS)),
        }
        folders[family] = {}
        for task, (index, overrides) in tasks.items():
            folder = root / f"{family}-{task}"
            build(family, index, tokenizer, **overrides).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            folders[family][task] = folder
    return folders


def encode(tokenizer, texts=SENTENCES):
    return tokenizer(texts, padding=True, return_tensors="pt")


# ----------------------------------------------------------------------------------------------------------------
# PEFT LoRA


HEAD = ("classifier",)  # the task head of sequence (dense + out_proj inside) and token classification


def labels_for(task, batch):
    if task == SEQUENCE:
        return torch.tensor([0, 2, 1])
    return torch.where(
        batch["attention_mask"].bool(), torch.arange(batch["input_ids"].numel()).view_as(batch["input_ids"]) % 3, -100
    )


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # peft asks the old name
@pytest.mark.parametrize(
    "task,task_type,modules_to_save",
    [
        (SEQUENCE, "SEQ_CLS", None),  # peft's standard recipe: it adds modules_to_save=["classifier", "score"] itself
        (SEQUENCE, None, HEAD),
        (SEQUENCE, "SEQ_CLS", HEAD),
        (TOKEN, None, HEAD),
        (TOKEN, "TOKEN_CLS", HEAD),
    ],
    ids=["sequence-SEQ_CLS", "sequence", "sequence-SEQ_CLS-classifier", "token", "token-TOKEN_CLS"],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_adapters_and_head_only_and_the_saved_adapter_reloads(
    family, task, task_type, modules_to_save, checkpoints, tokenizer, tmp_path
):
    """The whole task head lives under ``classifier``, the name peft's ``SEQ_CLS`` / ``TOKEN_CLS`` recipes train
    and save in full: every head weight trains, and the saved adapter restores it onto a base whose fresh head was
    drawn from another seed."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.tuners.lora import LoraLayer

    model_class = FAMILIES[family][2][task]
    base_folder = checkpoints[family]["mlm"]
    torch.manual_seed(1)
    model = model_class.from_pretrained(base_folder, num_labels=3)
    encoder_linears = [name for name, module in model.model.named_modules() if isinstance(module, torch.nn.Linear)]
    head_weights = {name for name, _ in model.classifier.named_parameters()}
    head_modules = None if modules_to_save is None else list(modules_to_save)  # a copy: peft extends it in place
    model = get_peft_model(
        model,
        LoraConfig(
            r=4, lora_alpha=8, target_modules=LORA_TARGETS[family], modules_to_save=head_modules, task_type=task_type
        ),
    )
    adapted = [name for name, module in model.base_model.model.model.named_modules() if isinstance(module, LoraLayer)]
    assert adapted == [name for name in encoder_linears if name.split(".")[-1] in LORA_TARGETS[family]]
    assert {name.split(".")[-1] for name in adapted} == set(LORA_TARGETS[family])  # every name is in the family
    assert not any(isinstance(module, LoraLayer) for module in model.base_model.model.classifier.modules())

    batch = encode(tokenizer)
    labels = labels_for(task, batch)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    model(**batch, labels=labels).loss.backward()
    optimizer.step()
    changed = {name for name, parameter in model.named_parameters() if not torch.equal(parameter, before[name])}
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert changed <= trainable
    assert all("lora_" in name or "modules_to_save" in name for name in trainable)
    # B starts at zero, so the first step moves every B (A's gradient is still zero) and the whole head.
    assert {name for name in trainable if "lora_B" in name or "modules_to_save" in name} <= changed
    trained_head = {name.split(".modules_to_save.default.")[1] for name in trainable if "modules_to_save" in name}
    assert trained_head == head_weights  # dense and out_proj for sequence classification, not out_proj alone

    model.eval()
    with torch.no_grad():
        trained = model(**batch).logits
    model.save_pretrained(tmp_path / "adapter")
    torch.manual_seed(2)  # a fresh base gets another random head: only the adapter's saved head can restore it
    reloaded = PeftModel.from_pretrained(
        model_class.from_pretrained(base_folder, num_labels=3), tmp_path / "adapter"
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, trained, rtol=0, atol=1e-6)
        merged = reloaded.merge_and_unload()
        assert type(merged) is model_class
        torch.testing.assert_close(merged(**batch).logits, trained, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")
@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_with_lora_gives_the_same_loss_and_gradients(family, checkpoints, tokenizer):
    """The usual memory-saving combination: a frozen base (no parameter of the layers needs a gradient) with
    checkpointed layers and LoRA adapters inside them."""
    from peft import LoraConfig, get_peft_model

    batch = encode(tokenizer)
    labels = labels_for(SEQUENCE, batch)
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(1)
        model = FAMILIES[family][2][SEQUENCE].from_pretrained(checkpoints[family]["mlm"], num_labels=3)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model = get_peft_model(
            model,
            LoraConfig(r=4, target_modules=LORA_TARGETS[family], init_lora_weights=False, modules_to_save=list(HEAD)),
        ).train()
        mlp_calls = []
        model.base_model.model.model.layers[0].mlp.register_forward_pre_hook(lambda *args: mlp_calls.append(1))  # noqa: B023 (called in this iteration)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        assert len(mlp_calls) == (2 if checkpointing else 1)  # recomputed in the backward when checkpointing
        gradients = {name: parameter.grad for name, parameter in model.named_parameters() if parameter.requires_grad}
        assert all(gradient is not None and gradient.abs().max() > 0 for gradient in gradients.values())
        results.append((loss.detach(), gradients))
    (expected_loss, expected), (loss, gradients) = results
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-6)
    assert gradients.keys() == expected.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected[name], rtol=1e-5, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# sentence-transformers


def reference_embeddings(folder, tokenizer):
    """Mean over real tokens of the bare model's last hidden state: (len(SENTENCES), hidden_size)."""
    model = AutoModel.from_pretrained(folder).eval()
    batch = encode(tokenizer)
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    return masked_mean(hidden, batch["attention_mask"])


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_transformers_mean_pools_the_last_hidden_state(family, checkpoints, tokenizer):
    from sentence_transformers import SentenceTransformer

    folder = checkpoints[family]["mlm"]
    model = SentenceTransformer(str(folder), device="cpu")  # a plain checkpoint: Transformer + mean pooling
    assert type(model[0].auto_model) is type(AutoModel.from_pretrained(folder))
    embeddings = model.encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, reference_embeddings(folder, tokenizer), rtol=0, atol=1e-5)


REMOTE_SENTENCE_TRANSFORMERS = without_encoderlab("""
    import json
    import sys

    import torch
    from sentence_transformers import SentenceTransformer

    folders, sentences, out_path = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    embeddings = {}
    for family, folder in folders.items():
        model = SentenceTransformer(folder, device="cpu", trust_remote_code=True)
        module = type(model[0].auto_model).__module__
        assert module.startswith("transformers_modules"), module
        embeddings[family] = model.encode(sentences, convert_to_tensor=True)
    torch.save(embeddings, out_path)
""")


@pytest.fixture(scope="module")
def remote_embeddings(tmp_path_factory, checkpoints):
    """{family: embeddings} from sentence-transformers in one interpreter where ``import encoderlab`` fails,
    loading each checkpoint through its own code (one subprocess for every family: its start costs seconds)."""
    import json

    work = tmp_path_factory.mktemp("remote_sentence_transformers")
    (work / "script.py").write_text(REMOTE_SENTENCE_TRANSFORMERS)
    folders = {family: str(checkpoints[family]["mlm"]) for family in FAMILIES}
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(work / "modules"),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(work / "script.py"),
            json.dumps(folders),
            json.dumps(SENTENCES),
            str(work / "embeddings.pt"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(work / "embeddings.pt")


@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_transformers_loads_the_checkpoint_code_without_encoderlab(
    family, checkpoints, tokenizer, remote_embeddings
):
    torch.testing.assert_close(
        remote_embeddings[family], reference_embeddings(checkpoints[family]["mlm"], tokenizer), rtol=0, atol=1e-5
    )


# ----------------------------------------------------------------------------------------------------------------
# gradient checkpointing on a task model


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(family, tokenizer):
    """Every parameter trained (tests/test_family_contract.py covers every preset's masked LM)."""
    batch = encode(tokenizer)
    labels = labels_for(SEQUENCE, batch)
    results = []
    for checkpointing in (False, True):
        model = build(family, SEQUENCE, tokenizer, num_labels=3).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        loss = model(**batch, labels=labels).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (expected_loss, expected), (loss, gradients) = results
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-6)
    for name, gradient in gradients.items():
        assert (gradient is None) == (expected[name] is None), name
        if gradient is not None:
            torch.testing.assert_close(gradient, expected[name], rtol=1e-5, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# pipelines on a saved checkpoint and its tokenizer


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask_pipeline_ranks_the_model_probabilities(family, checkpoints, tokenizer):
    folder = checkpoints[family]["mlm"]
    text = f"the value of an {tokenizer.mask_token} is returned"
    predictions = pipeline("fill-mask", model=str(folder))(text, top_k=3)
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[0]
    position = batch["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    probabilities, token_ids = logits[position].softmax(-1).topk(3)
    assert [prediction["token"] for prediction in predictions] == token_ids.tolist()
    torch.testing.assert_close(
        torch.tensor([prediction["score"] for prediction in predictions]), probabilities, rtol=0, atol=1e-6
    )
    assert predictions[0]["token_str"] == tokenizer.decode([token_ids[0]])


@pytest.mark.parametrize("family", FAMILIES)
def test_feature_extraction_pipeline_returns_the_last_hidden_state(family, checkpoints, tokenizer):
    folder = checkpoints[family]["mlm"]
    features = pipeline("feature-extraction", model=str(folder), return_tensors=True)(SENTENCES[0])
    with torch.no_grad():
        expected = AutoModel.from_pretrained(folder).eval()(**tokenizer(SENTENCES[0], return_tensors="pt"))
    torch.testing.assert_close(features, expected.last_hidden_state, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_classification_pipeline_names_labels_from_id2label(family, checkpoints, tokenizer):
    folder = checkpoints[family]["sequence"]
    results = pipeline("text-classification", model=str(folder), top_k=None)(SENTENCES)
    model = FAMILIES[family][2][SEQUENCE].from_pretrained(folder).eval()
    with torch.no_grad():
        probabilities = model(**encode(tokenizer)).logits.softmax(-1)
    for scores, expected in zip(results, probabilities, strict=True):
        assert {score["label"] for score in scores} == set(SEQUENCE_LABELS.values())
        by_label = {score["label"]: score["score"] for score in scores}
        torch.testing.assert_close(
            torch.tensor([by_label[SEQUENCE_LABELS[i]] for i in range(3)]), expected, rtol=0, atol=1e-6
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_token_classification_pipeline_tags_every_token_with_id2label_names(family, checkpoints, tokenizer):
    folder = checkpoints[family]["token"]
    text = SENTENCES[2]
    entities = pipeline("token-classification", model=str(folder), ignore_labels=[])(text)
    model = FAMILIES[family][2][TOKEN].from_pretrained(folder).eval()
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probabilities = model(**batch).logits[0].softmax(-1)
    special = set(tokenizer.all_special_ids)
    real = [index for index, token in enumerate(batch["input_ids"][0].tolist()) if token not in special]
    assert [entity["index"] for entity in entities] == real
    for entity in entities:
        score, label = probabilities[entity["index"]].max(-1)
        assert entity["entity"] == TOKEN_LABELS[int(label)]
        assert entity["score"] == pytest.approx(float(score), abs=1e-6)
        assert text[entity["start"] : entity["end"]].lower() == entity["word"].replace("##", "")
