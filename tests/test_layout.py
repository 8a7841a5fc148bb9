"""The package's shape: each module one step, and no module reaches into another's private names."""

import ast
from pathlib import Path

import pytest_simplefsdp

PACKAGE = Path(list(pytest_simplefsdp.__path__)[0])


def test_no_private_name_is_imported_across_modules():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:  # from .x import _name
                offenders += [f"{path.name}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and (PACKAGE / f"{node.value.id}.py").exists():
                offenders.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")  # import x; x._name
    assert offenders == []
