"""The built-in families and the fields of their configuration classes, read from this folder's source files.

Importing a configuration class imports transformers and torch (seconds); the command line checks a run config's
``model.family`` and ``model.config`` keys before that, so it reads the classes' ``model_type`` and ``__init__``
keywords with `ast` instead. tests/test_cli_fast_errors.py keeps the result equal to the imported classes'.
"""

import ast
from functools import cache
from pathlib import Path

FOLDER = Path(__file__).parent


@cache
def family_fields() -> dict[str, frozenset[str]]:
    """``model_type`` -> the keyword arguments of that family's configuration class and of its encoderlab bases."""
    classes = {
        node.name: node
        for path in sorted(FOLDER.glob("*.py"))
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef)
    }

    def fields(name: str) -> set[str]:
        node = classes[name]
        found = set()
        for statement in node.body:
            if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
                arguments = statement.args
                found |= {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs} - {"self"}
        for base in node.bases:  # bases outside this folder (transformers' PreTrainedConfig) add none
            if isinstance(base, ast.Name) and base.id in classes:
                found |= fields(base.id)
        return found

    return {
        model_type: frozenset(fields(name))
        for name, node in classes.items()
        if (model_type := _model_type(node)) is not None
    }


def _model_type(node: ast.ClassDef) -> str | None:
    """The string assigned to ``model_type`` in the class body, if any."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == "model_type" for t in statement.targets):
            return statement.value.value if isinstance(statement.value, ast.Constant) else None
    return None
