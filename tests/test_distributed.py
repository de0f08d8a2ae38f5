"""Two-process pretraining with torchrun on CPU (gloo): it completes and the ranks end with identical weights."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from test_pretrain import ENV, TINY


RANK_SCRIPT = """
    import os, sys
    import torch
    from encoderlab.training.pretrain import load_run_config, pretrain

    result = pretrain(load_run_config(sys.argv[1], ["output_dir=" + sys.argv[2]]))
    model = result.trainer.accelerator.unwrap_model(result.trainer.model)
    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(weights, os.path.join(sys.argv[3], f"rank{os.environ['RANK']}.pt"))
"""


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="torchrun is not installed")
def test_torchrun_two_processes_stay_in_sync(tmp_path):
    config = tmp_path / "run.json"
    raw = json.loads(json.dumps(TINY))
    raw["train"].update(token_budget=1500, evaluations=1)
    config.write_text(json.dumps(raw))
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", "29517", str(script), str(config),
         str(tmp_path / "run"), str(tmp_path)],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    # Both processes train: each step takes 2 x batch_size examples, so the budget needs about half the steps.
    assert results["plan"]["examples_per_step"] == 2 * TINY["train"]["batch_size"]
    assert results["steps"] == results["plan"]["max_steps"]
    assert (tmp_path / "run" / "model.safetensors").is_file()
