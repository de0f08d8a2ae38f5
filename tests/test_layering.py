"""The import graph of encoderlab/: no cycle between modules, and no import that goes up the layers (a module of
`evaluation` never imports `experiments`, `results` imports nothing of encoderlab, ...). Every import counts, the
ones inside functions too: a lazy import keeps ``--help`` fast, it does not make a cycle acceptable."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "encoderlab"

LAYERS = (
    ("results", "configuration", "registry", "metrics", "tokenization", "run_files"),
    ("export",),
    ("modeling",),
    ("",),  # encoderlab/__init__.py: registers the families with the transformers Auto classes
    ("hub_cards",),  # model cards (built from a run's record as data) and publishing a run folder
    ("training",),
    ("embedding",),  # encoderlab embed: a checkpoint's vectors of a corpus
    ("evaluation",),
    ("experiments",),
    ("cli", "convert_routing_cli"),  # the command line; convert-routing's command sits outside the carried modeling/
)
"""Top-level parts of encoderlab, lowest first: a module may import its own layer and the ones below it."""

MODELING_LAYERS = (
    ("", "documents", "layers", "positions"),  # "": the package's __init__, a docstring
    ("kernels",),
    ("attention", "base", "pairs"),
    ("heads",),
    ("dta", "dstg", "homa"),
    ("convert",),
)
"""The modules of encoderlab.modeling, lowest first, by the same rule: the kernels (one module per backend) read plain
tensors and import nothing of the attention inputs, the task heads or the families; `attention` prepares what they
read and dispatches to them; each family module holds its own nn.Modules."""
FAMILIES = ("dta", "dstg", "homa")
CARRIED = ("modeling", "configuration")
"""The parts of encoderlab whose modules checkpoints carry as flat copies (encoderlab/export.py)."""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(tree, outside_try=False) -> list:
    """The import statements of `tree`; with `outside_try`, those outside ``try`` blocks (optional imports)."""
    if not outside_try:
        return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    found = []

    def visit(node):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, ast.Try):
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(tree)
    return found


def imported_modules(path: Path, name: str, modules, outside_try=False) -> set:
    """The encoderlab modules that `path` (module `name`) imports, at the top or inside functions (``from .x import
    name`` counts as an import of ``x.name`` when that is a module); with `outside_try`, not those in ``try``
    blocks."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in import_nodes(ast.parse(path.read_text(encoding="utf-8")), outside_try):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            else:
                base = node.module
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {module for module in found if module in modules}


def import_graph(root: Path = PACKAGE, outside_try=False) -> dict:
    paths = {module_name(path, root): path for path in root.rglob("*.py")}
    return {name: imported_modules(path, name, paths, outside_try) for name, path in paths.items()}


def cycles(graph: dict) -> list[set]:
    """The strongly connected components of more than one module (and modules importing themselves): Tarjan's
    algorithm, iterative so a deep package cannot hit the recursion limit."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(component)
    return found


def part_of(module: str) -> str:
    """``encoderlab.modeling.kernels.sdpa`` -> ``modeling``; "" for the package itself."""
    return module.split(".")[1] if module.count(".") else ""


def imports_leaving(graph: dict, parts) -> list[str]:
    """The imports of a module of one of `parts` from a module of encoderlab outside them."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if part_of(module) in parts
        for target in sorted(targets)
        if target.startswith("encoderlab") and part_of(target) not in parts
    ]


def kernel_readers(graph: dict, part: str) -> list[str]:
    """The modules of `part` that import an attention kernel's module."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if part_of(module) == part
        for target in sorted(targets)
        if target.startswith("encoderlab.modeling.kernels")
    ]


def layer_of(module: str, layers=LAYERS, package="encoderlab") -> int:
    """The level in ``layers`` of ``module``'s part of ``package`` (its first name below the package)."""
    part = module[len(package) + 1 :].split(".")[0] if module.startswith(package + ".") else ""
    for level, parts in enumerate(layers):
        if part in parts:
            return level
    raise AssertionError(f"{module}: {package.replace('.', '/')}/{part} has no layer; add it where it belongs")


def upward_imports(graph: dict, layers=LAYERS, package="encoderlab") -> list[str]:
    def within(module):
        return module == package or module.startswith(package + ".")

    inside = {
        module: {target for target in targets if within(target)} for module, targets in graph.items() if within(module)
    }
    return [
        f"{module} (layer {layer_of(module, layers, package)}) imports {target} "
        f"(layer {layer_of(target, layers, package)})"
        for module, targets in sorted(inside.items())
        for target in sorted(targets)
        if layer_of(target, layers, package) > layer_of(module, layers, package)
    ]


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_cycle_finder_finds_planted_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_sees_relative_lazy_and_submodule_imports(tmp_path):
    root = tmp_path / "encoderlab"
    (root / "low").mkdir(parents=True)
    for name in ("__init__.py", "low/__init__.py", "low/rows.py"):
        (root / name).write_text("")
    (root / "top.py").write_text("def run():\n    from .low import rows\n")
    (root / "low" / "stats.py").write_text("from ..top import run\nimport encoderlab.low.rows\n")
    found = import_graph(root)
    assert found["encoderlab.top"] == {"encoderlab.low.rows"}
    assert found["encoderlab.low.stats"] == {"encoderlab.top", "encoderlab.low.rows"}


def test_no_import_cycles(graph):
    found = [sorted(component) for component in cycles(graph)]
    assert not found, f"import cycles: {found}"


def test_no_import_goes_up_the_layers(graph):
    assert not upward_imports(graph)
    planted = {"encoderlab.results.rows": {"encoderlab.experiments.sweeps"}, "encoderlab.experiments.sweeps": set()}
    assert upward_imports(planted) == [
        "encoderlab.results.rows (layer 0) imports encoderlab.experiments.sweeps (layer 8)"
    ]


def test_no_modeling_import_goes_up_its_layers(graph):
    assert not upward_imports(graph, MODELING_LAYERS, "encoderlab.modeling")
    planted = {"encoderlab.modeling.kernels.sdpa": {"encoderlab.modeling.attention"}}
    assert upward_imports(planted, MODELING_LAYERS, "encoderlab.modeling") == [
        "encoderlab.modeling.kernels.sdpa (layer 1) imports encoderlab.modeling.attention (layer 2)"
    ]


def test_no_family_imports_another(graph):
    families = {f"encoderlab.modeling.{family}" for family in FAMILIES}
    assert all(not (graph[family] & families) for family in families)


def test_results_stand_alone(graph):
    """The result helpers sit below evaluation and experiments and import no other part of encoderlab."""
    for module, targets in graph.items():
        if module.startswith("encoderlab.results"):
            assert all(target.startswith("encoderlab.results") for target in targets), (module, targets)


def test_the_code_a_checkpoint_carries_imports_only_itself():
    """modeling/ and configuration/ import nothing else of encoderlab but optionally (inside a ``try`` block, as
    `ExportMixin` imports the exporter): a checkpoint carries their flat copies alone (the export rule of
    encoderlab/export.py and docs/design-notes.md)."""
    assert not imports_leaving(import_graph(outside_try=True), CARRIED)
    planted = {"encoderlab.modeling.heads": {"encoderlab.training.lengths", "encoderlab.configuration.choices"}}
    assert imports_leaving(planted, CARRIED) == ["encoderlab.modeling.heads imports encoderlab.training.lengths"]


def test_optional_imports_are_told_from_the_others():
    source = (
        "try:\n    from .low import rows\nexcept ImportError:\n    pass\n\ndef run():\n    from .low import stats\n"
    )
    assert [node.lineno for node in import_nodes(ast.parse(source), outside_try=True)] == [7]
    assert len(import_nodes(ast.parse(source))) == 2


def test_training_takes_the_kernel_of_a_run_from_modeling_attention(graph):
    """The kernel of a run is chosen in one place (`encoderlab.modeling.attention.choose_attention`): no module of
    training/ reads a kernel module to decide it."""
    assert not kernel_readers(graph, "training")
    planted = {"encoderlab.training.pretrain": {"encoderlab.modeling.kernels.varlen", "encoderlab.modeling.attention"}}
    assert kernel_readers(planted, "training") == [
        "encoderlab.training.pretrain imports encoderlab.modeling.kernels.varlen"
    ]


FINETUNE = "encoderlab.training.finetune"
FINETUNE_RUN_CONFIG_READERS = ("config", "prepare", "pipeline", "run")
"""The modules of fine-tuning that read its run config: `config` defines it, `prepare` and `pipeline` hand its values
down, `run` is the command. Every other module of training/finetune/ takes values and imports none of them."""


def imports_outside(graph: dict, package: str, targets: set, allowed: set) -> list[str]:
    """``"A imports B"`` for each module A of `package` outside `allowed` that imports a module B of `targets`."""
    return [
        f"{module} imports {target}"
        for module, targets_of_module in sorted(graph.items())
        if module.startswith(package + ".") and module not in allowed
        for target in sorted(targets_of_module & targets)
    ]


def run_config_readers_imported(graph: dict) -> list[str]:
    """The imports of a fine-tuning module that reads the run config by another module of fine-tuning."""
    readers = {f"{FINETUNE}.{name}" for name in FINETUNE_RUN_CONFIG_READERS}
    return imports_outside(graph, FINETUNE, readers, readers)


def test_finetune_leaf_modules_take_values_not_the_run_config(graph):
    """Only the orchestration of fine-tuning reads the run config; nothing below it climbs back up to it."""
    assert {f"{FINETUNE}.{name}" for name in FINETUNE_RUN_CONFIG_READERS} <= graph.keys()
    assert not run_config_readers_imported(graph)
    planted = {
        f"{FINETUNE}.point": {f"{FINETUNE}.config", f"{FINETUNE}.tasks"},
        f"{FINETUNE}.pipeline": {f"{FINETUNE}.config", f"{FINETUNE}.point"},
    }
    assert run_config_readers_imported(planted) == [f"{FINETUNE}.point imports {FINETUNE}.config"]


TRAINING = "encoderlab.training"
PRETRAIN_RUN_CONFIG_READERS = ("pretrain", "pretrain_command", "prepare_data", "demo")
"""The modules of pretraining that read its run config (`run_config`): `pretrain` hands its values down, the others
are commands. Every other module of training/ (data, shards, collator, Trainer, optimizer, lengths, run folder) takes
values; so do fine-tuning's modules but its readers, which the test above names."""


def run_config_importers(graph: dict) -> list[str]:
    """The imports of the run-config module by a module of training/, but pretraining's and fine-tuning's readers."""
    allowed = {f"{TRAINING}.{name}" for name in PRETRAIN_RUN_CONFIG_READERS}
    allowed |= {f"{FINETUNE}.{name}" for name in FINETUNE_RUN_CONFIG_READERS}
    return imports_outside(graph, TRAINING, {f"{TRAINING}.run_config"}, allowed)


def test_training_leaf_modules_take_values_not_the_run_config(graph):
    """Only the orchestration and the commands of pretraining and fine-tuning read the run config."""
    assert {f"{TRAINING}.{name}" for name in PRETRAIN_RUN_CONFIG_READERS} <= graph.keys()
    assert run_config_importers(graph) == []
    planted = {f"{TRAINING}.trainer": {f"{TRAINING}.run_config"}, f"{TRAINING}.pretrain": {f"{TRAINING}.run_config"}}
    assert run_config_importers(planted) == [f"{TRAINING}.trainer imports {TRAINING}.run_config"]
