"""What bench/transfer/gpu_pretrain.py sends back from the device, and how it becomes run folders again.

The device tool returns at most 8 files of 16 MiB each from $OUT, 64 MiB together. A finished run comes back without
its Trainer checkpoints (optimizer states) and with its weights in bf16: half the bytes, and the runs trained under
bf16 autocast anyway (what is lost is the fp32 master weights' last 16 bits of mantissa, a relative change of at most
2^-8 per weight). The folders travel as one ``transfer_runs.tgz`` cut into parts under 16 MiB. Here, afterwards:

    PYTHONPATH=. python bench/transfer/returned_runs.py FILES_AT --into runs/transfer_gpu

joins the parts that ``gpu_pretrain_summary.json`` in FILES_AT lists, extracts the run folders and casts their
weights back to fp32, so that each is an ordinary run folder for `encoderlab experiment finetune` and the probes.
"""

import argparse
import io
import json
import math
import shutil
import sys
import tarfile
from pathlib import Path

PART_BYTES = 15 * 2**20  # under the device tool's 16 MiB a file
RETURN_BYTES = 60 * 2**20  # of the tool's 64 MiB from $OUT: the rest for the summary and the log
ARCHIVE = "transfer_runs.tgz"
SUMMARY = "gpu_pretrain_summary.json"


def cast_weights(folder: Path, dtype) -> None:
    """Every floating tensor of the folder's safetensors files to `dtype`, in place (metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for weights in sorted(folder.glob("*.safetensors")):
        with safe_open(weights, "pt") as handle:
            metadata = handle.metadata()
        tensors = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor
                   for name, tensor in load_file(weights).items()}
        save_file(tensors, weights, metadata=metadata)


def returned_copy(run_dir: Path, dest: Path) -> Path:
    """The run folder as it comes back: without Trainer checkpoints, its weights in bf16."""
    import torch

    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("checkpoint-*"))
    cast_weights(dest, torch.bfloat16)
    return dest


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def check_returnable(copies: dict) -> dict:
    """{size: MiB} of the returned copies of each size's runs; exits, naming each size's share, when all of them
    together would not come back (gzip only shrinks them, so their plain bytes are the bound)."""
    mib = {size: sum(folder_bytes(folder) for folder in folders) / 2**20 for size, folders in copies.items()}
    if sum(mib.values()) > RETURN_BYTES / 2**20:
        shares = ", ".join(f"{size} {value:.1f} MiB" for size, value in mib.items())
        raise SystemExit(f"--sizes {' '.join(copies)}: the run folders would come back as {sum(mib.values()):.1f} "
                         f"MiB ({shares}, weights in bf16), over the {RETURN_BYTES / 2**20:.0f} MiB the device tool "
                         "returns: pretrain fewer or smaller sizes")
    return {size: round(value, 1) for size, value in mib.items()}


def pack(runs: Path, names: list, out: Path) -> list:
    """The finished runs (their logs and returned copies) as one .tgz in `out`, cut into parts; the parts' names."""
    archive = runs / ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(runs / f"{name}.log", arcname=f"{name}.log")
            tar.add(returned_copy(runs / name, runs / "returned" / name), arcname=name)
    data, parts = archive.read_bytes(), []
    if len(data) > RETURN_BYTES:
        print(f"WARNING: {ARCHIVE} is {len(data) / 2**20:.1f} MiB, over the {RETURN_BYTES / 2**20:.0f} MiB that "
              "comes back", flush=True)
    for index in range(math.ceil(len(data) / PART_BYTES)):
        part = out / f"{ARCHIVE}.part{index}"
        part.write_bytes(data[index * PART_BYTES:(index + 1) * PART_BYTES])
        parts.append(part.name)
    return parts


def unpack(files_at: Path, into: Path) -> list:
    """The run folders of the parts in `files_at`, extracted into `into` with fp32 weights; their paths."""
    import torch

    summary = json.loads((files_at / SUMMARY).read_text())
    parts = [files_at / name for name in summary["parts"]]
    missing = [part.name for part in parts if not part.is_file()]
    if missing or not parts:
        raise SystemExit(f"{files_at}: the parts {missing or summary['parts']} of {ARCHIVE} are missing")
    with tarfile.open(fileobj=io.BytesIO(b"".join(part.read_bytes() for part in parts))) as tar:
        top = sorted({Path(member.name).parts[0] for member in tar.getmembers()})
        present = [name for name in top if (into / name).exists()]
        if present:
            raise SystemExit(f"--into {into} already holds {present}: unpack into another folder")
        tar.extractall(into, filter="data")
    folders = [into / name for name in top if (into / name).is_dir()]
    for folder in folders:
        cast_weights(folder, torch.float32)
    return folders


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("files_at", type=Path, help=f"the folder holding {SUMMARY} and the parts")
    arguments.add_argument("--into", type=Path, required=True, help="where the run folders go")
    args = arguments.parse_args(argv)
    if not (args.files_at / SUMMARY).is_file():
        arguments.error(f"{args.files_at} holds no {SUMMARY}")
    for folder in unpack(args.files_at, args.into):
        config = json.loads((folder / "config.json").read_text())
        tokens = json.loads((folder / "results.json").read_text())["tokens_seen"]
        print(f"{folder}: {tokens:,} tokens, {config['num_hidden_layers']} layers of {config['hidden_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
