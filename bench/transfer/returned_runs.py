"""What bench/transfer/gpu_pretrain.py writes for the trip back from the GPU machine, and how it becomes run folders
again.

A finished run travels without its Trainer checkpoints (optimizer states) and with its weights in bf16: half the
bytes, and the runs trained under bf16 autocast anyway (what is lost is the fp32 master weights' last 16 bits of
mantissa, a relative change of at most 2^-8 per weight). The folders travel as one ``transfer_runs.tgz`` cut into
parts of at most ``--part-mib`` (for transfers that limit a file's size), together at most ``--max-return-mib``.
Back on the CPU machine, with the --out folder copied to RETURNED:

    PYTHONPATH=. python bench/transfer/returned_runs.py RETURNED --into runs/transfer_gpu

joins the parts that ``gpu_pretrain_summary.json`` in RETURNED lists, extracts the run folders and casts their
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

MAX_RETURN_MIB = 60.0
"""Default bound on the packed runs: a few files that any way of copying results back takes in seconds."""
PART_MIB = 15.0
ARCHIVE = "transfer_runs.tgz"
SUMMARY = "gpu_pretrain_summary.json"


def cast_weights(folder: Path, dtype) -> None:
    """Every floating tensor of the folder's safetensors files to `dtype`, in place (metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for weights in sorted(folder.glob("*.safetensors")):
        with safe_open(weights, "pt") as handle:
            metadata = handle.metadata()
        tensors = {
            name: tensor.to(dtype) if tensor.is_floating_point() else tensor
            for name, tensor in load_file(weights).items()
        }
        save_file(tensors, weights, metadata=metadata)


def returned_copy(run_dir: Path, dest: Path) -> Path:
    """The run folder as it comes back: without Trainer checkpoints, its weights in bf16."""
    import torch

    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("checkpoint-*"))
    cast_weights(dest, torch.bfloat16)
    return dest


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def add_arguments(arguments: argparse.ArgumentParser) -> None:
    """gpu_pretrain.py's options for what it writes to copy back."""
    arguments.add_argument(
        "--max-return-mib",
        type=float,
        default=MAX_RETURN_MIB,
        help="the most the packed run folders may take together (checked after the calibration, before the real runs)",
    )
    arguments.add_argument(
        "--part-mib",
        type=float,
        default=PART_MIB,
        help=f"the packed runs are cut into files of at most this size (default {PART_MIB:g})",
    )


def check_arguments(args: argparse.Namespace) -> None:
    for name in ("max_return_mib", "part_mib"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)!r} must be > 0")


def check_returnable(copies: dict, limit_mib: float) -> dict:
    """{size: MiB} of the returned copies of each size's runs; exits, naming each size's share, when all of them
    together would pass `limit_mib` (gzip only shrinks them, so their plain bytes are the bound)."""
    mib = {size: sum(folder_bytes(folder) for folder in folders) / 2**20 for size, folders in copies.items()}
    if sum(mib.values()) > limit_mib:
        shares = ", ".join(f"{size} {value:.1f} MiB" for size, value in mib.items())
        raise SystemExit(
            f"--sizes {' '.join(copies)}: the run folders would come back as {sum(mib.values()):.1f} "
            f"MiB ({shares}, weights in bf16), over --max-return-mib={limit_mib:g}: pretrain fewer or "
            "smaller sizes, or allow more"
        )
    return {size: round(value, 1) for size, value in mib.items()}


def pack(runs: Path, names: list, out: Path, limit_mib: float, part_mib: float) -> list:
    """The finished runs (their logs and returned copies) as one .tgz in `out`, cut into parts of at most
    `part_mib`; the parts' names."""
    archive = runs / ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(runs / f"{name}.log", arcname=f"{name}.log")
            tar.add(returned_copy(runs / name, runs / "returned" / name), arcname=name)
    data, parts, part_bytes = archive.read_bytes(), [], int(part_mib * 2**20)
    if len(data) > limit_mib * 2**20:
        print(f"WARNING: {ARCHIVE} is {len(data) / 2**20:.1f} MiB, over --max-return-mib={limit_mib:g}", flush=True)
    for index in range(math.ceil(len(data) / part_bytes)):
        part = out / f"{ARCHIVE}.part{index}"
        part.write_bytes(data[index * part_bytes : (index + 1) * part_bytes])
        parts.append(part.name)
    return parts


def unpack(returned: Path, into: Path) -> list:
    """The run folders of the parts in `returned`, extracted into `into` with fp32 weights; their paths."""
    import torch

    summary = json.loads((returned / SUMMARY).read_text())
    parts = [returned / name for name in summary["parts"]]
    missing = [part.name for part in parts if not part.is_file()]
    if missing or not parts:
        raise SystemExit(f"{returned}: the parts {missing or summary['parts']} of {ARCHIVE} are missing")
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
    arguments.add_argument("returned", type=Path, help=f"the folder holding {SUMMARY} and the parts")
    arguments.add_argument("--into", type=Path, required=True, help="where the run folders go")
    args = arguments.parse_args(argv)
    if not (args.returned / SUMMARY).is_file():
        arguments.error(f"{args.returned} holds no {SUMMARY}")
    for folder in unpack(args.returned, args.into):
        config = json.loads((folder / "config.json").read_text())
        tokens = json.loads((folder / "results.json").read_text())["tokens_seen"]
        print(f"{folder}: {tokens:,} tokens, {config['num_hidden_layers']} layers of {config['hidden_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
