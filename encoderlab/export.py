"""Self-contained checkpoint code for ``trust_remote_code`` loading.

transformers copies a remote-code module and the files it imports with single-level relative imports
(``from .x import y``) from the checkpoint folder. encoderlab's modules live in subpackages and import each other
with ``from ..configuration.dta import ...``, so the export walks the import graph of a family, writes every
module it needs as one flat file (``encoderlab/modeling/dta.py`` -> ``modeling_dta.py``) with its package
imports rewritten to same-folder ones, and names the classes in ``config.auto_map``.

Imports inside ``try`` blocks are left alone: they are optional (the export hook itself is one) and transformers
does not require them either.

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
import importlib
from pathlib import Path

from .registry import FAMILIES

PACKAGE = "encoderlab"


def flat_module_name(module_name):
    """``encoderlab.modeling.dta`` -> ``modeling_dta``."""
    return "_".join(module_name.split(".")[1:])


def auto_map_for(config_class):
    """The ``auto_map`` entry of config.json for a registered family."""
    if config_class not in FAMILIES:
        raise ValueError(f"{config_class.__name__} is not a registered encoderlab family: {sorted(c.__name__ for c in FAMILIES)}")
    auto_map = {"AutoConfig": f"{flat_module_name(config_class.__module__)}.{config_class.__name__}"}
    for auto_name, model_class in FAMILIES[config_class].items():
        auto_map[auto_name] = f"{flat_module_name(model_class.__module__)}.{model_class.__name__}"
    return auto_map


def _package_imports(tree):
    """ImportFrom nodes that point into the package, outside try blocks."""
    found = []

    def visit(node):
        if isinstance(node, ast.Try):
            return
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == PACKAGE):
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


def _flatten_source(module_name):
    """Returns (rewritten source, names of the package modules it imports)."""
    module = importlib.import_module(module_name)
    path = Path(module.__file__)
    if path.name == "__init__.py":
        raise ValueError(f"{module_name} is a package; exported code must import concrete modules")
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    dependencies = []
    # Rewrite bottom-up so earlier line numbers stay valid.
    for node in sorted(_package_imports(ast.parse(source)), key=lambda n: n.lineno, reverse=True):
        target = _resolve(module_name, node)
        target_file = Path(importlib.import_module(target).__file__)
        if target_file.name == "__init__.py":
            raise ValueError(
                f"{module_name} line {node.lineno} imports the package {target}; import from its concrete module "
                "so the checkpoint export can flatten it"
            )
        dependencies.append(target)
        names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
        indent = " " * node.col_offset
        lines[node.lineno - 1: node.end_lineno] = [f"{indent}from .{flat_module_name(target)} import {names}\n"]
    header = f"# Exported by encoderlab from {module_name}; the package itself is not needed to run this file.\n"
    return header + "".join(lines), dependencies


def write_remote_code(config_class, save_directory):
    """Writes the flat modules of ``config_class``'s family into ``save_directory``; returns the file names."""
    roots = [config_class.__module__] + [cls.__module__ for cls in FAMILIES[config_class].values()]
    pending, written = list(dict.fromkeys(roots)), {}
    while pending:
        module_name = pending.pop()
        if module_name in written:
            continue
        source, dependencies = _flatten_source(module_name)
        written[module_name] = source
        pending.extend(d for d in dependencies if d not in written)
    save_directory = Path(save_directory)
    for module_name, source in written.items():
        (save_directory / f"{flat_module_name(module_name)}.py").write_text(source, encoding="utf-8")
    return sorted(f"{flat_module_name(m)}.py" for m in written)
