"""The DSTG experiment's analyses: every analysis of `encoderlab.evaluation.dstg` that applies to a trained arm, into
``OUT/analysis/<run>/`` (skipped when its files are there), and the per-arm files joined into ``dstg_<analysis>.csv``.
"""

import logging
from pathlib import Path

import numpy as np

from ...evaluation.dstg.documents import build_probe_documents
from ...results.rows import read_results, write_rows
from ...training.run_config import PretrainRunConfig as RunConfig
from ...training.sources import load_documents
from .arms import Arm

# Imported inside functions (cost): the analyses of encoderlab.evaluation.dstg and encoderlab.training.data (torch,
# transformers, datasets), so that --help and check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)

ANALYSIS_FILES = {
    "probes": "probes.csv",
    "heads": "heads.csv",
    "geometry": "ap_table.csv",
    "components": "components.csv",
}


def probe_texts(run: RunConfig):
    """The run's held-out documents (validation + test, split as `pretrain` split them): probe documents the model
    never trained on."""
    from ...training.data import split_documents

    documents = list(
        load_documents(
            run.data.source,
            text_field=run.data.text_field,
            split=run.data.split,
            streaming=run.data.streaming,
            limit=run.data.limit,
        )
    )
    splits = split_documents(
        documents, validation_size=run.data.validation_size, test_size=run.data.test_size, seed=run.train.seed
    )
    return splits["validation"] + splits["test"]


def analyse_arm(arm: Arm, run: RunConfig, out_dir: Path, num_documents=500):
    """Every analysis that applies to the arm's checkpoint, into ``out_dir/analysis/<run>``; an analysis whose
    CSV is there is skipped. Probes: every arm; AP table geometry: arms with a learned table; heads, component
    maps and AP hidden states: the disentangled arms."""
    from ...evaluation.dstg import components, geometry, heads, probes
    from ...evaluation.dstg.states import load_checkpoint

    folder = out_dir / "analysis" / arm.run_name
    folder.mkdir(parents=True, exist_ok=True)
    todo = [name for name, file in ANALYSIS_FILES.items() if not (folder / file).is_file()]
    if arm.preset in ("rp", "rope"):
        todo = [name for name in todo if name == "probes"]
    elif arm.preset == "ap":
        todo = [name for name in todo if name in ("probes", "geometry")]
    if not todo:
        return folder
    logger.info("%s: analyses %s", arm.run_name, ", ".join(todo))
    model, tokenizer = load_checkpoint(run.output_dir)
    texts = probe_texts(run)
    if "probes" in todo:
        write_rows(folder / "probes.csv", probes.probe_checkpoint(model, tokenizer, texts, num_documents))
    if "heads" in todo:
        write_rows(folder / "heads.csv", heads.heads_checkpoint(model, tokenizer, texts, num_documents))
    if "geometry" in todo:
        table = geometry.position_table(model)
        np.save(folder / "ap_table.npy", table)
        if arm.preset == "dstg":
            document = build_probe_documents(texts, tokenizer, model.config.max_position_embeddings, 1)[0]
            projections = geometry.ap_state_projections(model, document)
            np.savez(
                folder / "ap_states.npz",
                segments=document.segments,
                shares=[share for _, share in projections],
                **{f"layer{i}": points for i, (points, _) in enumerate(projections)},
            )
        write_rows(folder / "ap_table.csv", geometry.geometry_rows(table))
    if "components" in todo:
        maps, spans, rows = components.components_checkpoint(model, tokenizer, texts)
        np.savez(folder / "components.npz", spans=np.array(spans), **maps)
        write_rows(folder / "components.csv", rows)
    return folder


def collect(out_dir: Path, runs_rows):
    """The per-arm CSVs of every trained run joined into ``dstg_<analysis>.csv`` with arm and training seed; a
    per-arm CSV's own ``seed`` (the probes' fitting seed) becomes ``probe_seed``."""
    collected = {}
    for row in runs_rows:
        folder = out_dir / "analysis" / f"{row['arm']}-s{row['seed']}"
        for name, file in ANALYSIS_FILES.items():
            for entry in read_results(folder / file):
                entry = {("probe_seed" if key == "seed" else key): value for key, value in entry.items()}
                collected.setdefault(name, []).append({"arm": row["arm"], "seed": row["seed"], **entry})
    for name, rows in collected.items():
        write_rows(out_dir / f"dstg_{name}.csv", rows)
    return collected
