"""Imports sit at the top of their module (docs/design-notes.md, "Imports"). An import inside a function stays for
one of two reasons, said once in its module by a comment ``# Imported inside functions (cost): ...`` or ``(cycle)``:

- cost: the module is on the command line's torch-free path (`cli_path`: what ``encoderlab COMMAND --help`` and
  the subcommands' ``check(args)`` import), and the import is of a heavy library (`HEAVY`) or of an encoderlab
  module that imports one at its top;
- cycle: the import at the top would close an import cycle, which the comment names.

Even there, an import inside a function of the standard library, of a library not in `HEAVY`, of a module of ours
on the path anyway, or of something the module imports at its top already, belongs at the top. Optional imports
(inside a ``try`` that catches ImportError, the export rule's kind: encoderlab/export.py) are left to that rule, and
imports under ``if TYPE_CHECKING:`` never run.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import REPO, leaf_commands
from test_layering import PACKAGE, module_name

from encoderlab.cli import SUBCOMMANDS

HEAVY = (
    "accelerate",
    "datasets",
    "evaluate",
    "huggingface_hub",
    "matplotlib",
    "peft",
    "pyarrow",
    "scipy",
    "sklearn",
    "torch",
    "transformers",
    "triton",
)
"""Libraries that take a large part of a second or more to import (``python -X importtime``); numpy, tqdm, yaml and
safetensors take a small part of one and belong at the top."""
REASON = re.compile(r"^\s*# Imported inside functions \((\w+)\): \S", re.MULTILINE)
REASONS = ("cost", "cycle")
COMMAND_LINE = "encoderlab.cli"
"""The console script imports it to parse the command line, before any subcommand module."""


class Imports(ast.NodeVisitor):
    """The import statements of a module: at its top (run on import, class bodies included) and inside functions,
    each with the name of the outermost function it sits in."""

    def __init__(self):
        self.top, self.inside, self.function, self.optional = [], [], None, 0

    def visit_FunctionDef(self, node):
        outer, self.function = self.function, self.function or node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node):
        catches_import_error = any(
            handler.type is not None and "ImportError" in ast.unparse(handler.type) for handler in node.handlers
        )
        self.optional += catches_import_error
        for statement in node.body:
            self.visit(statement)
        self.optional -= catches_import_error
        for child in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(child)

    def visit_If(self, node):
        if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        if not self.optional:
            (self.top if self.function is None else self.inside).append((self.function, node))

    visit_ImportFrom = visit_Import


class Module:
    """One module of the package: its name, file, the comments that give its reason, and its imports."""

    def __init__(self, path: Path, root: Path):
        self.name, self.file = module_name(path, root), path.relative_to(root.parent).as_posix()
        self.package = self.name if path.name == "__init__.py" else self.name.rpartition(".")[0]
        source = path.read_text(encoding="utf-8")
        self.reasons = REASON.findall(source)
        imports = Imports()
        imports.visit(ast.parse(source))
        self.top, self.inside = imports.top, imports.inside

    def imported(self, node, names) -> set[str]:
        """The modules that ``node`` imports: ``from .x import y`` is ``<package>.x.y`` where that is one of
        `names` (the package's modules), else ``<package>.x``."""
        if isinstance(node, ast.Import):
            return {alias.name for alias in node.names}
        base = node.module
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names}

    def where(self, node) -> str:
        return f"{self.file}:{node.lineno} {ast.unparse(node)}"


def package_modules(root: Path = PACKAGE) -> dict[str, Module]:
    return {module.name: module for module in (Module(path, root) for path in sorted(root.rglob("*.py")))}


def with_packages(name: str, root: str) -> set[str]:
    """``name`` and the packages above it (their ``__init__`` runs first), but the root: the console script enters
    the package without running its ``__init__`` (encoderlab_cli)."""
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)} - ({root} if name != root else set())


def closure(modules: dict[str, Module], start: set[str]) -> set[str]:
    """`start` and every module of the package that they import at their top, transitively."""
    root = min(modules, key=len)
    waiting, found = set(start), set()
    while waiting:
        name = waiting.pop()
        if name in found or name not in modules:
            continue
        found.add(name)
        for _, node in modules[name].top:
            for target in modules[name].imported(node, modules):
                waiting |= with_packages(target, root) & modules.keys()
    return found


def cli_path(
    modules: dict[str, Module], subcommands: dict = SUBCOMMANDS, functions=("add_arguments", "check")
) -> set[str]:
    """The modules that ``encoderlab COMMAND --help`` and the subcommands' ``check(args)`` import: the command line,
    the subcommand modules, what their `functions` import inside them, and what all of these import at their top."""
    root = min(modules, key=len)
    start = set()
    for name in {module for _, module in leaf_commands(subcommands)} | {COMMAND_LINE}:
        start |= with_packages(name, root)
        for function, node in modules[name].inside if name in modules else ():
            if function in functions:
                start |= {
                    package
                    for target in modules[name].imported(node, modules)
                    for package in with_packages(target, root)
                }
    return closure(modules, start)


def heavy_libraries(modules: dict[str, Module], name: str) -> set[str]:
    """The `HEAVY` libraries that importing module ``name`` brings (at the top of it or of what it imports)."""
    return {
        library.split(".")[0]
        for module in closure(modules, with_packages(name, min(modules, key=len)))
        for _, node in modules[module].top
        for library in modules[module].imported(node, modules)
        if library.split(".")[0] in HEAVY
    }


def needless_imports(modules: dict[str, Module], path: set[str]) -> list[str]:
    """The imports inside functions that belong at the top of their module, each as ``file:line import: why``."""
    found = []
    for module in modules.values():
        on_top = {name for _, node in module.top for name in module.imported(node, modules)}
        for _, node in module.inside:
            imported = module.imported(node, modules)
            ours = {name for name in imported if name in modules}
            heavy = {name for name in imported if name.split(".")[0] in HEAVY} | {
                library for name in ours - path for library in heavy_libraries(modules, name)
            }
            if imported <= on_top:
                why = "imported at the top already"
            elif all(name.split(".")[0] in sys.stdlib_module_names for name in imported):
                why = "the standard library costs nothing at the top"
            elif "cycle" in module.reasons:
                continue
            elif module.name not in path:
                why = f"{module.name} is off the torch-free command-line path and names no cycle"
            elif not heavy:
                why = "on the torch-free command-line path, but it brings no heavy library (HEAVY)"
            else:
                continue
            found.append(f"{module.where(node)}: {why}")
    return sorted(found)


def reasons_misstated(modules: dict[str, Module], path: set[str]) -> list[str]:
    """Modules whose reason comment is missing, repeated, unknown, left behind, or says cost off the path."""
    found = []
    for name, module in sorted(modules.items()):
        reasons = module.reasons
        if module.inside and len(reasons) != 1:
            found.append(
                f"{module.file}: {len(module.inside)} imports inside functions, {len(reasons)} reason comments"
            )
        elif not module.inside and reasons:
            found.append(f"{module.file}: a reason comment, but no import inside a function")
        elif reasons and reasons[0] not in REASONS:
            found.append(f"{module.file}: reason {reasons[0]!r}; allowed: {', '.join(REASONS)}")
        elif reasons == ["cost"] and name not in path:
            found.append(f"{module.file}: says cost, but it is off the torch-free command-line path")
    return found


@pytest.fixture(scope="module")
def modules():
    return package_modules()


def test_every_import_inside_a_function_has_a_reason(modules):
    found = needless_imports(modules, cli_path(modules))
    assert not found, "imports to move to the top of their module:\n" + "\n".join(found)


def test_each_module_says_its_reason_once(modules):
    found = reasons_misstated(modules, cli_path(modules))
    assert not found, "\n".join(found)


def test_the_path_is_what_help_imports(modules):
    """`cli_path` (the part ``add_arguments`` reaches) is the set of encoderlab modules that building every
    subcommand's parser imports, the way the console script builds it."""
    code = (
        "import json, sys\nfrom encoderlab_cli import enter_package_without_init\nenter_package_without_init()\n"
        "from encoderlab import cli\n"
        f"for argv in {[argv for argv, _ in leaf_commands(SUBCOMMANDS)]!r}:\n    cli.build_parser(argv)\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.startswith('encoderlab.'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    imported = set(json.loads(result.stdout.splitlines()[-1])) - {"encoderlab_cli"}
    assert imported == cli_path(modules, functions=("add_arguments",))


def planted_package(root: Path, files: dict[str, str]) -> dict[str, Module]:
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    return package_modules(root)


PLANTED = {
    "__init__.py": "import torch\n",  # not run by the console script
    "cli.py": "",
    "light.py": "import json\n",
    "heavy.py": "import transformers\n",
    "command.py": (
        "from . import light\n\n# Imported inside functions (cost): transformers, for --help.\n\n"
        "def add_arguments(parser):\n    from . import options\n\n"
        "def run(args):\n    import numpy\n    import torch\n    from . import heavy, light\n    import json\n"
    ),
    "options.py": "",
    "low/__init__.py": "",
    "low/rows.py": "def read():\n    import torch\n",
    "low/loop.py": "# Imported inside functions (cycle): low.loop imports low.rows, which imports low.loop.\n\n"
    "def read():\n    from . import rows\n",
    "stale.py": "# Imported inside functions (cost): nothing any more.\n",
}


def test_needless_imports_are_named_with_file_line_and_why(tmp_path):
    modules = planted_package(tmp_path / "encoderlab", PLANTED)
    path = cli_path(modules, {"command": ("encoderlab.command", "a subcommand")})
    assert path == {"encoderlab.cli", "encoderlab.command", "encoderlab.light", "encoderlab.options"}
    assert needless_imports(modules, path) == [
        "encoderlab/command.py:12 import json: the standard library costs nothing at the top",
        "encoderlab/command.py:6 from . import options: on the torch-free command-line path, but it brings no heavy "
        "library (HEAVY)",
        "encoderlab/command.py:9 import numpy: on the torch-free command-line path, but it brings no heavy library "
        "(HEAVY)",
        "encoderlab/low/rows.py:2 import torch: encoderlab.low.rows is off the torch-free command-line path and names "
        "no cycle",
    ]
    assert reasons_misstated(modules, path) == [
        "encoderlab/low/rows.py: 1 imports inside functions, 0 reason comments",
        "encoderlab/stale.py: a reason comment, but no import inside a function",
    ]


def test_an_import_of_a_light_module_of_ours_is_needless_on_the_path(tmp_path):
    files = {**PLANTED, "command.py": PLANTED["command.py"].replace("heavy, light", "light")}
    modules = planted_package(tmp_path / "encoderlab", files)
    path = cli_path(modules, {"command": ("encoderlab.command", "a subcommand")})
    assert "encoderlab/command.py:11 from . import light: imported at the top already" in needless_imports(
        modules, path
    )
