"""The package's shape: each module one step, and no module reaches into another's private names."""

import ast
from pathlib import Path

import pytest_simplefsdp

PACKAGE = Path(list(pytest_simplefsdp.__path__)[0])


def private_uses(path):
    """`from .x import _name`, and `_attr` of anything imported from another module of the package
    (`import x; x._name`, `from .x import Cls; Cls._name`)."""
    tree = ast.parse(path.read_text())
    imported, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            for a in node.names:
                imported.add(a.asname or a.name)
                if a.name.startswith("_"):
                    out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Name) and node.value.id in imported:
            out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_no_private_name_is_imported_across_modules():
    offenders = [line for path in sorted(PACKAGE.rglob("*.py")) for line in private_uses(path)]
    assert offenders == []


def test_the_check_catches_a_private_use(tmp_path):
    bad = PACKAGE / "launch" / "_layout_probe.py"  # inside the package, so relative imports resolve as theirs
    bad.write_text("from .torchrun import TorchrunLauncher\nfrom .procs import _hidden\nTorchrunLauncher._x()\n")
    try:
        assert private_uses(bad) == ["launch/_layout_probe.py:2: procs._hidden",
                                     "launch/_layout_probe.py:3: TorchrunLauncher._x"]
    finally:
        bad.unlink()
