"""`encoderlab embed` on the command line: the same run as `encoderlab.embedding.embed`, options that the function
takes one for one, and choices that are the ones the modules act on."""

import inspect

import numpy as np

from encoderlab import cli
from encoderlab.embedding import embed, read_manifest, read_pooled
from test_embed_equality import random_sequences, save_model, write_fasta


def test_every_option_is_a_keyword_of_the_function():
    argv = ["embed", "MODEL", "INPUT", "--output", "OUT"]
    args = cli.build_parser(argv).parse_args(argv)
    options = {key for key in vars(args) if key not in ("model", "input", "output", "module", "debug")
               and not key.startswith("command_")}
    keywords = {name for name, parameter in inspect.signature(embed).parameters.items()
                if parameter.kind == parameter.KEYWORD_ONLY}
    assert options == keywords - {"progress"}


def test_the_command_writes_what_the_function_writes(tmp_path):
    model = str(save_model(tmp_path / "model", "homa-pairwise"))
    fasta = str(write_fasta(tmp_path / "in.fasta", random_sequences([5, 30, 12], seed=7)))
    argv = ["embed", model, fasta, "--output", str(tmp_path / "cli"), "--pooling", "mean", "max", "--layers", "-1",
            "0", "--dtype", "float16", "--normalize"]
    assert cli.main(argv) == 0
    embed(model, fasta, tmp_path / "function", pooling=["mean", "max"], layers=[-1, 0], dtype="float16",
          normalize=True, progress=False)
    for column in ("mean", "max", "mean_layer0", "max_layer0"):
        assert np.array_equal(read_pooled(tmp_path / "cli", column)[1], read_pooled(tmp_path / "function", column)[1])
    manifest = read_manifest(tmp_path / "cli")
    assert manifest["complete"] and manifest["model"]["name"] == "model" and manifest["input"]["name"] == "in.fasta"
    assert str(tmp_path) not in (tmp_path / "cli" / "manifest.json").read_text()  # no path of this machine
