"""One fine-tuning run from its typed run config to its folder (`finetune`), and every GLUE task in turn
(`finetune_glue`). Here and in `prepare` the run config is read; the modules below them take its values, or the
small frozen values built from them (`Point`, `Schedule`, `Recipe`, `ModelPlan`).

1. every key and value is checked, then the model path, the task's data files and the output folder, before
   anything is read or written (`config`, `model_setup`, `prepare`);
2. the task kind reads the raw splits and turns them into features (labels checked against the label names);
3. every point of the hyper-parameter grid (``search``: learning rate x batch size x weight decay; one point by
   default) trains from the checkpoint with the HF Trainer (`point`): evaluation on the validation split every
   ``train.eval_steps`` steps (default `point.evaluation_interval`: 5 per run), early stop after ``train.patience``
   evaluations without improvement, at most ``train.epochs`` epochs or ``train.max_steps`` steps, best checkpoint
   kept; it is then scored on every evaluation split;
4. the run folder (`report`): the best point's model + tokenizer (loadable with the Auto classes and in the
   pipelines, with and without encoderlab), ``results.json``, ``metrics.csv``, ``dev_curve.png``, ``grid.csv`` and
   ``grid.png`` (every point), ``run_config.yaml`` and a model card (README.md); with LoRA also ``adapter/``.
   ``grid/<point>/`` keeps each point's results; its model only with ``search.keep_all_models``.

With ``resume`` an interrupted run continues with the same run config: finished grid points are read back, the
unfinished one resumes from its last checkpoint.
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..run_folder import check_run_folder, start_run_folder
from .config import DEFAULT_OUTPUT_ROOT, FinetuneRunConfig, load_finetune_config
from .data import is_local
from .model_setup import check_fsdp_launch
from .point import Recipe, grid_points, schedule, train_point
from .prepare import prepare
from .prepared import Prepared
from .report import drop_point_model, glue_table, run_results, save_run
from .tasks import tasks_in_group

# Imported inside functions (cost): accelerate and ..trainer (torch, transformers), so that --help and check() answer
# without them (encoderlab/cli.py).

COMMAND = "finetune"


@dataclass
class FinetuneResult:
    run_dir: Path
    results: dict


def finetune(run: FinetuneRunConfig, *, resume: bool = False, overwrite: bool = False) -> FinetuneResult:
    """Fine-tune, evaluate and save one run (every grid point); see the module docstring. With `overwrite`, the
    encoderlab run in the output folder is replaced once the data is read (`run_folder.start_run_folder`)."""
    from accelerate import PartialState

    from ..trainer import cpu_only

    run_dir = Path(run.output_dir)
    check_fsdp_launch(run.model.path, run.model.trust_remote_code, run.train.precision, run.lora.r)
    check_run_folder(run_dir, COMMAND, resume, run.to_dict(), overwrite)
    prepared = prepare(run)
    state = PartialState(cpu=cpu_only())
    state.wait_for_everyone()  # every rank has checked before the main process writes
    if state.is_main_process:
        start_run_folder(run_dir, COMMAND, run.to_dict(), overwrite)
    state.wait_for_everyone()
    points, best = train_grid(run, prepared, run_dir, state)
    results = run_results(prepared, points, best)
    if state.is_main_process:
        save_run(run_dir, prepared, best, results)
        if not run.search.keep_all_models:  # last: the run folder now holds the best point's model
            drop_point_model(run_dir, best)
    state.wait_for_everyone()
    return FinetuneResult(run_dir=run_dir, results=results)


def train_grid(run: FinetuneRunConfig, prepared: Prepared, run_dir: Path, state) -> tuple[list[dict], dict]:
    """Every point of the grid in turn, each with its `Schedule`; returns every point's results and the best point's
    (the highest validation main metric). A beaten point's model is deleted as soon as a better one has finished,
    unless ``search.keep_all_models``."""
    recipe, main = point_recipe(run), prepared.task.main_metric
    points, best = [], None
    for point in grid_points(
        run.search.lr or [run.train.lr],
        run.search.batch_size or [run.train.batch_size],
        run.search.weight_decay or [run.train.weight_decay],
    ):
        steps = schedule(
            len(prepared.features["train"]),
            point.batch_size * run.train.gradient_accumulation_steps * state.num_processes,
            run.train.epochs,
            run.train.max_steps,
            run.train.eval_steps,
        )
        points.append(train_point(point, steps, recipe, prepared, run_dir / "grid" / point.name))
        if best is None or points[-1]["metrics"]["validation"][main] > best["metrics"]["validation"][main]:
            beaten, best = best, points[-1]
        else:
            beaten = points[-1]
        if beaten is not None and not run.search.keep_all_models and state.is_main_process:
            drop_point_model(run_dir, beaten)
    return points, best


def point_recipe(run: FinetuneRunConfig) -> Recipe:
    """The `Recipe` every grid point trains with: the ``train`` values of its fields' names."""
    return Recipe(**{field.name: getattr(run.train, field.name) for field in dataclasses.fields(Recipe)})


def glue_tasks_found(data_path: str | None) -> list:
    """The GLUE tasks with train and dev files under a local `data_path`; every task for a Hub dataset."""
    tasks = tasks_in_group("glue")
    if data_path is None or not is_local(data_path):
        return tasks
    return [
        task
        for task in tasks
        if all((Path(data_path) / task.local.folder / name).is_file() for name in task.local.files.values())
    ]


def finetune_glue(model: str, config: str | None, overrides: list[str], resume: bool, overwrite: bool = False) -> dict:
    """Every GLUE task found, one after the other, in ``output_dir/<task>``; returns {task: main metrics}."""
    probe = load_finetune_config("sst2", model, config, overrides)  # checks the shared keys once
    tasks = glue_tasks_found(probe.data.path)
    if not tasks:
        raise ValueError(f"data.path={probe.data.path!r} holds no GLUE task folder with train and dev files")
    given = probe.output_dir != str(DEFAULT_OUTPUT_ROOT / "sst2")
    root = Path(probe.output_dir) if given else DEFAULT_OUTPUT_ROOT / "glue"
    scores, dev_sets = {}, {}
    for task in tasks:
        run = load_finetune_config(task.name, model, config, [*overrides, f"output_dir={root / task.name}"])
        results = finetune(run, resume=resume, overwrite=overwrite).results
        scores[task.name], dev_sets[task.name] = results["metrics"]["validation"], results["data"]["validation"]
    table = glue_table(scores, dev_sets)
    root.mkdir(parents=True, exist_ok=True)
    (root / "glue_results.md").write_text(table + "\n", encoding="utf-8")
    (root / "glue_results.json").write_text(json.dumps(scores, indent=2), encoding="utf-8")
    print(table)
    return scores
