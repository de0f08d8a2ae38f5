"""Self-contained checkpoint code for ``trust_remote_code`` loading.

transformers copies a remote-code module and the files it imports with single-level relative imports
(``from .x import y``) from the checkpoint folder. encoderlab's modules live in subpackages and import each other
with ``from ..configuration.dta import ...``, so the export walks the import graph of a family, writes every
module it needs as one flat file (``encoderlab/modeling/dta.py`` -> ``modeling_dta.py``) with its package
imports rewritten to same-folder ones, and names the classes in ``config.auto_map``.

Imports inside ``try`` blocks are left alone: they are optional (the export hook itself is one) and transformers
does not require them either. Every other import of encoderlab's own code in a module a checkpoint carries follows
`EXPORT_RULE`, which `import_problems` checks (tests/test_export.py runs it on every module of modeling/ and
configuration/), so a contributor learns the rule from a test that names the import, not from a failed export.

Why not transformers' own custom-code saving (``register_for_auto_class`` + ``custom_object_save``)? It copies
the file of the class and, found by a regex, the files named by ``from .x import`` in that same folder. That does
not fit encoderlab's layout of two subpackages:

- ``modeling/dta.py`` imports ``from ..configuration.dta import DTABertConfig``; the regex reads that as a module
  ``.configuration.dta`` beside it, and the copy fails (``FileNotFoundError: .../modeling/.configuration.dta.py``,
  transformers 5.23).
- Files of the two subpackages share names (``configuration/dta.py`` and ``modeling/dta.py``, both ``base.py``):
  copied into one folder they overwrite each other, and its ``auto_map`` entries name a class by its last module
  name (``dta.DTABertForMaskedLM``, ``dta.DTABertConfig``), which cannot tell them apart.

Only a flat layout (every config and model file of a family in one folder, with distinct names, as transformers'
own models are) would make the rewriting unnecessary. Ours flattens at save time instead, and what it writes is
what transformers can handle: every import single-level, so a model loaded from a checkpoint's flat copy is saved
again by transformers' own ``custom_object_save`` (`encoderlab.modeling.base.ExportMixin` defers to it there).
"""

import ast
from pathlib import Path

from .registry import FAMILIES

PACKAGE = "encoderlab"
PACKAGE_DIR = Path(__file__).resolve().parent

EXPORT_RULE = (
    "a module that checkpoints carry (modeling/, configuration/ and what they import) imports encoderlab's own code "
    "as `from <module> import <names>`, naming a module (`from .kernels.sdpa import SdpaInputs`), never a package "
    "(`from .kernels import sdpa`, `from . import documents`) nor with `import encoderlab...`: the export rewrites "
    "each such import to one of the same folder's flat files; an optional import goes inside a `try` block, which "
    "the export leaves alone"
)


def flat_module_name(module_name):
    """``encoderlab.modeling.dta`` -> ``modeling_dta``."""
    return "_".join(module_name.split(".")[1:])


def auto_map_for(config_class):
    """The ``auto_map`` entry of config.json for a registered family."""
    if config_class not in FAMILIES:
        raise ValueError(
            f"{config_class.__name__} is not a registered encoderlab family: {sorted(c.__name__ for c in FAMILIES)}"
        )
    auto_map = {"AutoConfig": f"{flat_module_name(config_class.__module__)}.{config_class.__name__}"}
    for auto_name, model_class in FAMILIES[config_class].items():
        auto_map[auto_name] = f"{flat_module_name(model_class.__module__)}.{model_class.__name__}"
    return auto_map


def _package_imports(tree):
    """Import and ImportFrom nodes that point into the package, outside try blocks."""
    found = []

    def visit(node):
        if isinstance(node, ast.Try):
            return
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == PACKAGE):
            found.append(node)
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == PACKAGE for alias in node.names):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(module_name, node):
    if node.level == 0:
        return node.module
    package_parts = module_name.split(".")[:-1]
    base = package_parts[: len(package_parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _module_path(module_name):
    """The file of ``module_name``: its ``.py`` file, its package's ``__init__.py``, or None where neither exists."""
    path = PACKAGE_DIR.parent.joinpath(*module_name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_source(module_name):
    """The source of one of encoderlab's modules."""
    return _module_path(module_name).read_text(encoding="utf-8")


def import_problems(module_name, source=None):
    """Where the module ``module_name`` (its ``source``, read from its file unless given) breaks `EXPORT_RULE`: one
    message per import, naming the module, the line, the import as written and the rule; [] when it keeps it."""
    source = module_source(module_name) if source is None else source
    problems = []
    for node in _package_imports(ast.parse(source)):
        written = ast.get_source_segment(source, node)
        if isinstance(node, ast.Import):
            why = "imports encoderlab by its absolute name"
        else:
            target = _resolve(module_name, node)
            path = _module_path(target)
            why = (
                f"imports {target}, which does not exist"
                if path is None
                else f"imports the package {target}"
                if path.name == "__init__.py"
                else None
            )
        if why is not None:
            problems.append(f"{module_name} line {node.lineno}: `{written}` {why}; the rule: {EXPORT_RULE}")
    return problems


def carried_modules(config_class):
    """The modules a checkpoint of ``config_class``'s family carries: its config's and its models' modules and every
    module of encoderlab they import outside ``try`` blocks, each checked against `EXPORT_RULE` (a ValueError names
    the first import that breaks it)."""
    roots = [config_class.__module__] + [cls.__module__ for cls in FAMILIES[config_class].values()]
    pending, found = list(dict.fromkeys(roots)), []
    while pending:
        module_name = pending.pop()
        if module_name in found:
            continue
        if _module_path(module_name).name == "__init__.py":
            raise ValueError(f"cannot export {module_name}, a package; the rule: {EXPORT_RULE}")
        problems = import_problems(module_name)
        if problems:
            raise ValueError(f"cannot export {module_name}: {problems[0]}")
        found.append(module_name)
        imports = _package_imports(ast.parse(module_source(module_name)))
        pending.extend(_resolve(module_name, node) for node in imports)
    return found


def _flatten_source(module_name):
    """The source of ``module_name`` (a module that keeps `EXPORT_RULE`) with its package imports rewritten to
    same-folder ones."""
    source = module_source(module_name)
    lines = source.splitlines(keepends=True)
    # Rewrite bottom-up so earlier line numbers stay valid.
    for node in sorted(_package_imports(ast.parse(source)), key=lambda n: n.lineno, reverse=True):
        target = _resolve(module_name, node)
        names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
        indent = " " * node.col_offset
        lines[node.lineno - 1 : node.end_lineno] = [f"{indent}from .{flat_module_name(target)} import {names}\n"]
    header = f"# Exported by encoderlab from {module_name}; the package itself is not needed to run this file.\n"
    return header + "".join(lines)


def write_remote_code(config_class, save_directory):
    """Writes the flat modules of ``config_class``'s family into ``save_directory``; returns the file names. Every
    module is flattened (and checked) before the first file is written."""
    written = {module_name: _flatten_source(module_name) for module_name in carried_modules(config_class)}
    by_flat_name = {}
    for module_name in written:
        by_flat_name.setdefault(flat_module_name(module_name), []).append(module_name)
    clashes = [sorted(names) for names in by_flat_name.values() if len(names) > 1]
    if clashes:
        raise ValueError(f"{clashes[0]} flatten to one file name in a checkpoint; rename one of them")
    save_directory = Path(save_directory)
    for module_name, source in written.items():
        (save_directory / f"{flat_module_name(module_name)}.py").write_text(source, encoding="utf-8")
    return sorted(f"{flat_module_name(m)}.py" for m in written)
