"""Two-process pretraining on CPU (gloo), through torchrun and through accelerate: it completes, the Trainer sees a
world of 2, and the ranks end with identical weights. Two-process fine-tuning through torchrun: both ranks train and
the run folder is complete."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from test_finetune import tiny_dta  # noqa: F401  (fixture: a tiny DTA-BERT masked LM + WordPiece tokenizer)
from test_pretrain import ENV, TINY

RANK_SCRIPT = """
    import os, sys
    import torch
    from encoderlab.training.pretrain import load_run_config, pretrain

    result = pretrain(load_run_config(sys.argv[1], ["output_dir=" + sys.argv[2]]))
    model = result.trainer.accelerator.unwrap_model(result.trainer.model)
    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save({"weights": weights, "world_size": result.trainer.args.world_size},
               os.path.join(sys.argv[3], f"rank{os.environ['RANK']}.pt"))
"""

BIN = os.path.dirname(sys.executable)


def launch_two_ranks(launcher: list[str], tmp_path, env=ENV):
    """Run the tiny pretraining under `launcher` (which must start 2 processes) and check the ranks agree."""
    config = tmp_path / "run.json"
    raw = json.loads(json.dumps(TINY))
    raw["train"].update(token_budget=1500, evaluations=1)
    config.write_text(json.dumps(raw))
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    command = [*launcher, str(script), str(config), str(tmp_path / "run"), str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "rank1.pt").is_file(), "only one process ran"
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["weights"].keys() == rank1["weights"].keys()
    for name in rank0["weights"]:
        assert torch.equal(rank0["weights"][name], rank1["weights"][name]), name
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    # Both processes train: each step takes 2 x batch_size examples, so the budget needs about half the steps.
    assert results["plan"]["examples_per_step"] == 2 * TINY["train"]["batch_size"]
    assert results["steps"] == results["plan"]["max_steps"]
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "torchrun")), reason="torchrun is not installed")
def test_torchrun_two_processes_stay_in_sync(tmp_path):
    launch_two_ranks([os.path.join(BIN, "torchrun"), "--nproc_per_node", "2", "--master_port", "29517"], tmp_path)


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "accelerate")), reason="accelerate is not installed")
def test_accelerate_multi_gpu_launcher_runs_two_cpu_processes(tmp_path):
    # `accelerate launch --cpu` (or `use_cpu: true` in its config) always takes the one-process launcher; the
    # multi-process launcher with no visible GPU starts 2 CPU ranks (gloo). This is the command the README gives.
    launcher = [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29518"]  # fmt: skip
    launch_two_ranks(launcher, tmp_path, env={**ENV, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "torchrun")), reason="torchrun is not installed")
def test_finetune_under_torchrun_trains_on_two_ranks(shared_data, tiny_dta, tmp_path):  # noqa: F811
    """`torchrun ... -m encoderlab.cli finetune`: one epoch of 64 examples at 4 per rank is 8 steps on two ranks (16 on
    one), every training token is counted once over both ranks, and the main process writes a complete run folder."""
    from test_finetune import RUN_FILES, run_files
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    overrides = [f"data.path={shared_data / 'glue'}", "data.train_limit=64", "data.eval_limit=16",
                 "train.max_steps=null", "train.epochs=1", "train.batch_size=4", "train.eval_steps=4",
                 "train.logging_steps=2", f"output_dir={run_dir}"]  # fmt: skip
    sets = [arg for override in overrides for arg in ("--set", override)]
    command = [
        os.path.join(BIN, "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        "29519",
        "-m",
        "encoderlab.cli",
        "finetune",
        "--task",
        "sst2",
        "--model",
        str(tiny_dta),
        *sets,
    ]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 8, results["steps"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_dta)
    rows = (shared_data / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:65]
    tokens = sum(len(ids) for ids in tokenizer([row.split("\t")[0] for row in rows])["input_ids"])
    assert results["tokens_seen"] == tokens
    assert RUN_FILES <= run_files(run_dir)
    assert not any(run_dir.glob("grid/*/checkpoint-*")), "checkpoints are removed once the point is finished"
    assert "Saved to" in done.stdout
