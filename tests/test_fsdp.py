"""FSDP2 sharded training (encoderlab.training.fsdp) on CPU: gloo, two processes.

accelerate and the Trainer do not shard on CPU (they train DDP and say nothing), so the model-level properties
are tested with `fully_shard` applied by accelerate's own ``fsdp2_prepare_model`` (`fsdp.shard_model`), its plugin
read from the shipped ``fsdp2`` config through accelerate's launch code, and checkpoints written and read by
accelerate's ``save_fsdp_model`` / ``load_fsdp_model``: the functions the Trainer runs on GPUs. The processes are
tests/fsdp_worker.py. Tolerances (fp32, 4 AdamW steps at lr 1e-2, eps 1e-6): losses within 1e-5 relative, final
weights within 2e-5 (seen: 4e-6, from the reduce-scatter summing in another order; with eps 1e-8 Adam turns such
differences in gradients that are zero up to rounding into 3e-4 in weights); DDP and one process agree exactly.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import fsdp_worker
import pytest
import torch
from test_pretrain import ENV, TINY, tiny_run

from encoderlab.training import fsdp
from encoderlab.training.launch import accelerate_config_names, accelerate_config_path

BIN = os.path.dirname(sys.executable)
TORCHRUN = os.path.join(BIN, "torchrun")
WORKER = str(Path(__file__).with_name("fsdp_worker.py"))
DTA, HOMA, DSTG = "dta-unet-value-embeddings", "homa-homa-gated", "dstg-dstg"
CLASSIFIER = DTA + fsdp_worker.CLASSIFY
CASES = [DTA, HOMA, DSTG, CLASSIFIER]
"""DTA-BERT with U-Net, value embeddings and a tied decoder; HOMA with its 0-d fusion gate; DSTG's two-stream
preset; and a DTA sequence classifier (fine-tuning)."""
STEPS, SAVE_AT, KILL_AT = 4, 2, 3
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 2e-5

WORKER_ENV = {**ENV, "PYTHONFAULTHANDLER": "1"}
"""A worker that aborts in torch's C++ code prints where its Python stood."""
needs_torchrun = pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(*arguments) -> list[str]:
    """Two processes on this machine at a free port (`--standalone`), so that pytest-xdist workers never meet."""
    return [TORCHRUN, "--standalone", "--nproc_per_node", "2", WORKER, *map(str, arguments)]


def run_worker(*arguments, check: bool = True) -> subprocess.CompletedProcess:
    command = torchrun(*arguments)
    done = subprocess.run(command, env=WORKER_ENV, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def train_args(**values) -> Namespace:
    defaults = dict(
        command="train",
        mode="single",
        case=",".join(CASES),
        tie=True,
        optimizer="adamw",
        steps=STEPS,
        checkpoint=None,
        save_at=0,
        stop_at=0,
        resume=False,
        activation_checkpointing=False,
        gather=None,
    )
    return Namespace(**{**defaults, **values})


def train_three_ways(folder: Path) -> SimpleNamespace:
    """The four cases trained under FSDP2 and DDP (two processes each, at once) and in one process; the FSDP2
    run also gathers each final model into a save_pretrained folder."""
    common = ["train", "--case", ",".join(CASES), "--tie", "--steps", STEPS]
    extra = {"fsdp": ["--gather", folder / "gathered"], "ddp": []}
    launches = {
        mode: subprocess.Popen(
            torchrun(*common, "--mode", mode, "--out", folder / f"{mode}.pt", *extra[mode]),
            env=WORKER_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("fsdp", "ddp")
    }
    fsdp_worker.train(train_args(out=folder / "single.pt"))
    for mode, launch in launches.items():
        _, errors = launch.communicate(timeout=600)
        assert launch.returncode == 0, f"{mode}: {errors[-4000:]}"
    results = {mode: torch.load(folder / f"{mode}.pt") for mode in ("fsdp", "ddp", "single")}
    return SimpleNamespace(folder=folder, **results)


# ---------------------------------------------------------------------------------------------
# Shipped configs and what they make
# ---------------------------------------------------------------------------------------------


def test_pretrain_builds_its_optimizer_when_the_trainer_asks_so_that_fsdp_accepts_it(tmp_path, monkeypatch):
    """With FSDP on, the Trainer shards the model before it creates the optimizer and refuses one passed in through
    `optimizers=` (bench/gpu/check.py found this on an H100: every FSDP2 pretraining run stopped there). Here the
    Trainer's argument check runs as if FSDP were on; the run must train with encoderlab's Muon + AdamW over the
    parameters of the model the Trainer holds."""
    from test_pretrain import tiny_run
    from transformers import Trainer, TrainerCallback

    from encoderlab.training.pretrain import pretrain

    validate = Trainer._validate_args

    def validate_as_if_fsdp(self):
        self.is_fsdp_enabled = True
        try:
            validate(self)
        finally:
            self.is_fsdp_enabled = False

    monkeypatch.setattr(Trainer, "_validate_args", validate_as_if_fsdp)
    seen = {}

    class RecordOptimizer(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            seen["groups"] = [group["name"] for group in optimizer.param_groups]
            seen["optimized"] = {id(p) for group in optimizer.param_groups for p in group["params"]}
            seen["trainable"] = {id(p) for p in model.parameters() if p.requires_grad}

    pretrain(tiny_run(tmp_path / "run"), callbacks=[RecordOptimizer()])
    assert seen["groups"] == ["muon", "adamw"]
    assert seen["optimized"] == seen["trainable"]


def test_shipped_configs_and_their_paths():
    assert accelerate_config_names() == ["ddp", "deepspeed_zero2", "fsdp2"]
    assert accelerate_config_path("fsdp2").name == "fsdp2.yaml"
    with pytest.raises(ValueError, match=r"accelerate config 'fsdp3' is not shipped; allowed: \['ddp', "):
        accelerate_config_path("fsdp3")
    done = subprocess.run([sys.executable, "-m", "encoderlab.cli", "config-path", "fsdp2"], env=ENV,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and Path(done.stdout.strip()) == accelerate_config_path("fsdp2")


def test_pretrain_help_lists_the_accelerate_configs(capsys):
    from encoderlab.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["pretrain", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "accelerate launch --config_file $(encoderlab config-path fsdp2)" in help_text
    assert "ddp, deepspeed_zero2, fsdp2" in help_text


def test_fsdp2_config_gives_the_plugin_and_trainer_settings_expected(monkeypatch, tmp_path):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from encoderlab.training.trainer import training_arguments

    variables = fsdp.launch_environment(accelerate_config_path("fsdp2"), ["--num_processes", "2"])
    assert fsdp.fsdp_requested(variables)
    assert variables["FSDP_VERSION"] == "2" and variables["ACCELERATE_MIXED_PRECISION"] == "bf16"
    plugin = fsdp.fsdp_plugin(variables)
    assert isinstance(plugin, FullyShardedDataParallelPlugin)
    assert plugin.fsdp_version == 2
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.transformer_cls_names_to_wrap is None  # encoderlab fills in the model's blocks
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.reshard_after_forward is True and plugin.activation_checkpointing is False
    with_checkpointing = fsdp.launch_environment(accelerate_config_path("fsdp2"), ["--fsdp_activation_checkpointing",
                                                                                   "true"])  # fmt: skip
    assert fsdp.fsdp_plugin(with_checkpointing).activation_checkpointing is True
    # The Trainer takes the launch's FSDP and precision from the environment, not from its own arguments.
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    run = tiny_run(tmp_path / "run", train={"precision": "bf16"})
    args = training_arguments(run.train, run.output_dir, max_steps=10)
    assert args.mixed_precision == "bf16" and not args.fsdp and args.fsdp_plugin_args is None
    ddp = fsdp.launch_environment(accelerate_config_path("ddp"))
    assert not fsdp.fsdp_requested(ddp) and ddp["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_the_launch_is_read_from_the_environment_of_the_call(monkeypatch):
    """datasets' multi-process map puts a copy in place of os.environ when it ends: the checks read the environment
    the process has when they run, not the object it had when encoderlab was imported."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    fsdp_launch(monkeypatch)
    assert fsdp.fsdp_requested()
    with pytest.raises(ValueError, match="distributed_type=FSDP needs GPUs"):
        fsdp.check_launch("bf16", lambda: None)


@pytest.mark.parametrize(
    "case,blocks",
    [
        (DTA, ["DTABertLayer"]),
        (HOMA, ["HOMALayer"]),
        (DSTG, ["DSTGLayer"]),
        ("dstg-rope", ["NeoBERTLayer"]),
        (CLASSIFIER, ["DTABertLayer"]),
    ],
)
def test_wrap_block_names_are_the_blocks_the_model_has(case, blocks):
    model = fsdp_worker.new_model(case)
    assert fsdp.wrap_block_names(model) == blocks
    if case.startswith("dstg"):  # accelerate alone wants every listed block, and DSTG lists two
        plugin = fsdp.fsdp_plugin(fsdp.launch_environment(accelerate_config_path("fsdp2")))
        with pytest.raises(ValueError, match="Could not find the transformer layer class"):
            plugin.set_auto_wrap_policy(model)


@pytest.mark.parametrize("case", [DTA, HOMA])
def test_scalar_parameters_become_vectors_with_the_same_outputs(case):
    """`fully_shard` refuses 0-d parameters (DTA's U-Net scalars, HOMA's fusion gate): they become 1-element
    vectors, which the models broadcast to the same results."""
    model = fsdp_worker.new_model(case)
    inputs = fsdp_worker.batch(0, 0, model.config.vocab_size)
    scalars = [name for name, parameter in model.named_parameters() if parameter.ndim == 0]
    assert scalars
    expected = model(**inputs)
    fsdp.reshape_scalar_parameters(model)
    assert model._fsdp_scalar_parameters == scalars
    assert all(dict(model.named_parameters())[name].shape == (1,) for name in scalars)
    got = model(**inputs)
    assert got.loss.shape == expected.loss.shape
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before anything trains
# ---------------------------------------------------------------------------------------------


def test_block_names_that_match_nothing_are_refused():
    model = fsdp_worker.new_model(DTA)
    with pytest.raises(ValueError, match=r"fsdp_transformer_layer_cls_to_wrap=\['HOMALayer'\]: \['HOMALayer'\] is not"):
        fsdp.wrap_block_names(model, ["HOMALayer"])
    model._no_split_modules = ["NoSuchLayer"]
    with pytest.raises(ValueError, match=r"has no module of its _no_split_modules=\['NoSuchLayer'\]"):
        fsdp.wrap_block_names(model)


def test_missing_accelerate_config_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="accelerate config file .*nope.yaml' does not exist"):
        fsdp.launch_environment(tmp_path / "nope.yaml")


def fsdp_launch(monkeypatch, *launch_args):
    for name, value in fsdp.launch_environment(accelerate_config_path("fsdp2"), list(launch_args)).items():
        monkeypatch.setenv(name, value)


def test_fsdp_run_on_cpu_stops_before_anything_is_written(monkeypatch, tmp_path):
    from encoderlab.training.pretrain import pretrain

    fsdp_launch(monkeypatch)
    run = tiny_run(tmp_path / "run", train={"precision": "bf16"})
    with pytest.raises(ValueError, match="distributed_type=FSDP needs GPUs: without one, accelerate trains"):
        pretrain(run)
    assert not (tmp_path / "run").exists()


def test_fsdp_finetune_on_cpu_stops_before_anything_is_written(monkeypatch, tmp_path):
    from encoderlab.training.finetune.config import load_finetune_config
    from encoderlab.training.finetune.pipeline import finetune

    run = load_finetune_config("sst2", str(tmp_path / "model"), overrides=[f"output_dir={tmp_path / 'run'}",
                                                                          "train.precision=bf16"])  # fmt: skip
    fsdp_launch(monkeypatch)
    with pytest.raises(ValueError, match="distributed_type=FSDP needs GPUs"):
        finetune(run)
    with pytest.raises(ValueError, match="lora.r=4: LoRA under FSDP is not supported"):
        finetune(load_finetune_config("sst2", str(tmp_path / "model"), overrides=["lora.r=4"]))
    assert not (tmp_path / "run").exists()


def test_launch_checks_on_a_gpu_machine(monkeypatch, tmp_path):
    """Past the GPU check (as on a GPU machine): wrong block names and a precision the run does not train in."""
    from encoderlab.training.pretrain import pretrain

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fsdp_launch(monkeypatch, "--fsdp_transformer_layer_cls_to_wrap", "HOMALayer")
    with pytest.raises(ValueError, match=r"\['HOMALayer'\] is not a module of DTABertForMaskedLM"):
        pretrain(tiny_run(tmp_path / "run", train={"precision": "bf16"}))
    fsdp_launch(monkeypatch, "--fsdp_version", "1")
    with pytest.raises(ValueError, match="fsdp_version='1': encoderlab supports FSDP2 only"):
        pretrain(tiny_run(tmp_path / "run", train={"precision": "bf16"}))
    fsdp_launch(monkeypatch)  # bf16, as shipped
    with pytest.raises(ValueError, match="mixed_precision='bf16' but train.precision='fp32' trains fp32"):
        pretrain(tiny_run(tmp_path / "run", train={"precision": "fp32"}))
    assert not (tmp_path / "run").exists()


def test_muon_under_deepspeed_is_refused(monkeypatch, tmp_path):
    from encoderlab.training.pretrain import pretrain

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="optimizer.name='muon' under DeepSpeed ZeRO"):
        pretrain(tiny_run(tmp_path / "run", optimizer={"name": "muon"}))
    assert not (tmp_path / "run").exists()


def test_trainer_that_fell_back_to_ddp_is_stopped(monkeypatch):
    from accelerate.utils import DistributedType

    fsdp_launch(monkeypatch)
    accelerator = SimpleNamespace(state=SimpleNamespace(), distributed_type=DistributedType.MULTI_CPU)
    with pytest.raises(RuntimeError, match="asked for FSDP, but accelerate set up .*MULTI_CPU"):
        fsdp.configure_trainer(SimpleNamespace(accelerator=accelerator))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "accelerate")), reason="accelerate is not installed")
def test_accelerate_launch_of_fsdp2_on_cpu_stops_with_a_clear_error(tmp_path):
    """The real launcher: `accelerate launch --config_file $(encoderlab config-path fsdp2)` on a CPU machine."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({**TINY, "train": {**TINY["train"], "precision": "bf16"}}))
    command = [os.path.join(BIN, "accelerate"), "launch", "--config_file", str(accelerate_config_path("fsdp2")),
               "--num_processes", "2", "--main_process_port", str(free_port()), "-m", "encoderlab.cli", "pretrain",
               "--config", str(config), "--set", f"output_dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(command, env={**ENV, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode != 0
    assert "encoderlab: error: distributed_type=FSDP needs GPUs" in done.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Every family and preset wraps: blocks as units, tied decoders tied, same logits and gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_torchrun
def test_every_family_and_preset_shards_with_the_same_logits_and_gradients(tmp_path):
    """All 27 cases of tests/test_family_contract.py (DTA with and without U-Net and value embeddings, HOMA's
    attention kinds and fusions, the four DSTG presets), tied and untied."""
    run_worker("wrap", "--out", tmp_path / "wrap.pt")
    result = torch.load(tmp_path / "wrap.pt")
    assert result["cases"] == 27
    assert result["failures"] == []


@pytest.mark.slow
@needs_torchrun
def test_fsdp_activation_checkpointing_keeps_logits_and_gradients(tmp_path):
    run_worker("wrap", "--case", f"{DTA},{HOMA},{DSTG}", "--activation-checkpointing", "--out", tmp_path / "ac.pt")
    assert torch.load(tmp_path / "ac.pt")["failures"] == []


# ---------------------------------------------------------------------------------------------
# FSDP2 vs DDP vs one process
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_torchrun
def test_fsdp_ddp_and_one_process_train_alike_and_the_gathered_folder_loads(tmp_path):
    """One test, so that pytest-xdist never trains the three ways twice. The gathered DTA-BERT folder loads
    through the Auto classes (tied decoder tied) and through remote code without encoderlab, with equal logits."""
    from test_export import IDS, MASK, run_without_encoderlab
    from transformers import AutoModelForMaskedLM

    runs = train_three_ways(tmp_path)
    for case in CASES:
        single = runs.single[case]
        initial = fsdp_worker.new_model(case, tie=True).state_dict()
        assert len(single["losses"]) == STEPS
        assert any(not torch.equal(initial[name], tensor) for name, tensor in single["weights"].items()), case
        for mode in ("fsdp", "ddp"):
            result = getattr(runs, mode)[case]
            torch.testing.assert_close(result["losses"], single["losses"], rtol=LOSS_RTOL, atol=0, msg=f"{mode} {case}")
            assert result["weights"].keys() == single["weights"].keys(), (mode, case)
            for name, tensor in single["weights"].items():
                assert result["weights"][name].shape == tensor.shape, (mode, case, name)  # 0-d gathered as 0-d
                torch.testing.assert_close(result["weights"][name], tensor, rtol=0, atol=WEIGHT_ATOL,
                                           msg=f"{mode} {case} {name}")  # fmt: skip
    folder = tmp_path / "gathered" / DTA
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "DTABertForMaskedLM"  # not FSDPDTABertForMaskedLM
    assert model.lm_head.decoder.weight is model.model.embeddings.word_embeddings.weight  # tied after loading
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, runs.fsdp[DTA]["weights"][name]), name
    with torch.no_grad():
        logits = model(input_ids=IDS, attention_mask=MASK).logits
    remote_logits, _ = run_without_encoderlab(tmp_path, folder, "fsdp")
    assert torch.equal(remote_logits, logits)


# ---------------------------------------------------------------------------------------------
# Sharded checkpoints: kill, resume, world size
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_torchrun
def test_resume_from_a_sharded_checkpoint_equals_the_uninterrupted_run_and_checks_the_world_size(tmp_path):
    """DTA-BERT with Muon (the default optimizer: its combined state goes through torch.distributed.checkpoint),
    trained to step 4 uninterrupted, and killed at step 3 after a checkpoint at step 2, then resumed: bitwise the
    same. Resuming those shards with another number of processes, or without FSDP, is refused."""
    common = ["train", "--mode", "fsdp", "--case", DTA, "--tie", "--optimizer", "muon", "--steps", STEPS,
              "--save-at", SAVE_AT]  # fmt: skip
    run_worker(*common, "--checkpoint", tmp_path / "whole", "--out", tmp_path / "whole.pt")
    killed = run_worker(*common, "--checkpoint", tmp_path / "killed", "--stop-at", KILL_AT, "--out",
                        tmp_path / "killed.pt")  # fmt: skip
    assert not (tmp_path / "killed.pt").exists(), killed.stdout[-2000:]
    run_worker(*common, "--checkpoint", tmp_path / "killed", "--resume", "--out", tmp_path / "resumed.pt")
    whole, resumed = torch.load(tmp_path / "whole.pt")[DTA], torch.load(tmp_path / "resumed.pt")[DTA]
    checkpoint = tmp_path / "killed" / DTA
    shards = sorted(p.name for p in (checkpoint / fsdp.FSDP_CHECKPOINT_DIR).glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own
    assert resumed["losses"] == whole["losses"][SAVE_AT:]
    for name, tensor in whole["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name

    assert fsdp.sharded_checkpoint_world_size(checkpoint) == 2
    fsdp.check_resume(checkpoint, world_size=2, fsdp=True)
    with pytest.raises(ValueError, match="written by 2 processes, this run has 1; resume it with --num_processes 2"):
        fsdp.check_resume(checkpoint, world_size=1, fsdp=True)
    with pytest.raises(ValueError, match="holds a sharded FSDP checkpoint; resume it with the same FSDP launch"):
        fsdp.check_resume(checkpoint, world_size=2, fsdp=False)
    plain = tmp_path / "checkpoint-2"
    plain.mkdir()
    fsdp.check_resume(plain, world_size=2, fsdp=False)
    with pytest.raises(ValueError, match="is not sharded"):
        fsdp.check_resume(plain, world_size=2, fsdp=True)


# ---------------------------------------------------------------------------------------------
# Several machines: two torchrun launchers meeting at a rendezvous
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_torchrun
def test_two_node_launch_on_one_machine_pretrains(tmp_path):
    """`torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT`, once per
    "node": a short pretraining with a world of 2 (data parallel: FSDP needs GPUs)."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({**TINY, "train": {**TINY["train"], "token_budget": 1500, "evaluations": 1}}))
    port = free_port()
    nodes = [
        subprocess.Popen([TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "fsdp-test",
                          "-m", "encoderlab.cli", "pretrain", "--config", str(config), "--set",
                          f"output_dir={tmp_path / 'run'}"],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]  # fmt: skip
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, errors) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, errors[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plan"]["examples_per_step"] == 2 * TINY["train"]["batch_size"]  # two processes trained
    assert results["steps"] == results["plan"]["max_steps"]
    assert (tmp_path / "run" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-2 (only where deepspeed is installed: it is not a dependency of encoderlab)
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_zero2_config_pretrains_on_two_cpu_processes(tmp_path):
    """The shipped config through `accelerate launch` and the Trainer, DeepSpeed's CPU accelerator (gloo)."""
    from transformers import AutoModelForMaskedLM

    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {**TINY, "optimizer": {"name": "adamw"}, "train": {**TINY["train"], "token_budget": 1500, "evaluations": 1}}
        )
    )
    config_file = accelerate_config_path("deepspeed_zero2")
    command = [
        os.path.join(BIN, "accelerate"),
        "launch",
        "--config_file",
        str(config_file),
        "--mixed_precision",
        "no",
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        "-m",
        "encoderlab.cli",
        "pretrain",
        "--config",
        str(config),
        "--set",
        f"output_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        command,
        env={**ENV, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plan"]["examples_per_step"] == 2 * TINY["train"]["batch_size"]
    assert results["steps"] == results["plan"]["max_steps"]
    model, info = AutoModelForMaskedLM.from_pretrained(tmp_path / "run", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]  # the gathered weights, not an empty save
    assert all(torch.isfinite(p).all() for p in model.parameters())
