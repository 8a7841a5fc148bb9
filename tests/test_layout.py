"""The package's shape: each module one step, and no module reaches into another's private names."""

import ast
from pathlib import Path

import pytest

import pytest_simplefsdp

PACKAGE = Path(list(pytest_simplefsdp.__path__)[0])
# the checks that plant a probe module in the package (a circle, a private use) and the ones that scan it run on one
# xdist worker, one after the other: a scan beside a planted circle found it (CI, 2026-12-07)
pytestmark = pytest.mark.xdist_group("package_tree")


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
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_no_private_name_is_imported_across_modules():
    offenders = [line for path in sorted(PACKAGE.rglob("*.py")) for line in private_uses(path)]
    assert offenders == []


def test_the_check_catches_a_private_use(tmp_path):
    bad = PACKAGE / "launch" / "_layout_probe.py"  # inside the package, so relative imports resolve as theirs
    bad.write_text("from .torchrun import TorchrunLauncher\nfrom .procs import _hidden\nTorchrunLauncher._x()\n")
    try:
        assert private_uses(bad) == [
            "launch/_layout_probe.py:2: procs._hidden",
            "launch/_layout_probe.py:3: TorchrunLauncher._x",
        ]
    finally:
        bad.unlink()


def target_reads(path):
    """(line, member) of every member read on a target outside targets/: ``<x>.target.<member>`` and
    ``getattr(<x>.target, "<member>", ...)``."""
    tree, out = ast.parse(path.read_text()), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "target":
            out.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Attribute)
            and node.args[0].attr == "target"
            and isinstance(node.args[1], ast.Constant)
        ):
            out.append((node.lineno, node.args[1].value))
    return out


def undeclared_target_reads(paths):
    from pytest_simplefsdp.hookspecs import Target

    declared = set(Target.__annotations__) | {n for n in vars(Target) if not n.startswith("_")}
    return [
        f"{p.relative_to(PACKAGE)}:{line}: target.{name}"
        for p in paths
        for line, name in target_reads(p)
        if name not in declared
    ]


def test_every_member_read_on_a_target_is_in_the_target_protocol():
    """A plugin's target is built from hookspecs.Target: a member the package reads that the protocol does not
    list would fail only at run time, on someone else's target."""
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if "targets" not in p.relative_to(PACKAGE).parts]
    assert sum(len(target_reads(p)) for p in paths) > 30  # (the walk sees the package's reads)
    assert undeclared_target_reads(paths) == []


def test_the_protocol_check_catches_an_undeclared_read():
    bad = PACKAGE / "run" / "_protocol_probe.py"
    bad.write_text(
        "def f(run):\n    run.target.command()\n    return run.target.made_up, "
        "getattr(run.target, 'ALSO_MADE_UP', None)\n"
    )
    try:
        assert undeclared_target_reads([bad]) == [
            "run/_protocol_probe.py:3: target.made_up",
            "run/_protocol_probe.py:3: target.ALSO_MADE_UP",
        ]
    finally:
        bad.unlink()


def module_name(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path):
    """(module imported, line, whether inside a function) for every import of the package's own modules."""
    name = module_name(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    local = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    typing_only = {
        id(n)
        for i in ast.walk(tree)
        if isinstance(i, ast.If) and "TYPE_CHECKING" in ast.unparse(i.test)
        for n in ast.walk(i)
    }
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets = []
        if isinstance(node, ast.ImportFrom):
            root = ".".join(base[: len(base) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (root, node.module or "") if p)
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]  # `from . import x`: x may be a module
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            if t.split(".")[0] == "pytest_simplefsdp":
                out.append((t, node.lineno, id(node) in local))
    return out


def import_graph(root=PACKAGE):
    modules = {module_name(p): p for p in root.rglob("*.py")}
    graph = {m: set() for m in modules}
    for m, path in modules.items():
        for target, _, _ in package_imports(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != m:
                graph[m].add(target)
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    assert circles(import_graph()) == []


def test_the_circle_check_catches_a_circle():
    a, b = PACKAGE / "report" / "_circle_a.py", PACKAGE / "store" / "_circle_b.py"
    a.write_text("from ..store import _circle_b\n")
    b.write_text("def f():\n    from ..report._circle_a import x\n")  # a function-local import closes it too
    try:
        assert ["pytest_simplefsdp.report._circle_a", "pytest_simplefsdp.store._circle_b"] in circles(import_graph())
    finally:
        a.unlink()
        b.unlink()


# the entry points pytest loads in every run import the rest inside their hooks: that is what keeps them light
LAZY_ENTRY_POINTS = {"pytest_simplefsdp.plugin", "pytest_simplefsdp.launch.slurm_plugin"}


def test_no_function_local_import_of_the_package_outside_the_entry_points():
    found = [
        f"{module_name(p)}:{line}: {target}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if module_name(p) not in LAZY_ENTRY_POINTS
        for target, line, local in package_imports(p)
        if local
    ]
    assert found == []


def test_every_mutant_the_gate_names_is_implemented_in_the_shim_and_back():
    """judge/mutants.py (what the tier runs and judges) and shim/mutants.py (what injects each bug in a rank)
    name the same set: a name on one side only is a mutant that cannot run, or one nobody judges."""
    from pytest_simplefsdp.judge.mutants import TITAN02, TITAN03
    from pytest_simplefsdp.shim.mutants import IMPLEMENTED

    assert sorted({m.name for m in TITAN03 + TITAN02}) == sorted(IMPLEMENTED)
    for name, (moment, _) in IMPLEMENTED.items():
        assert moment in ("install", "load", "grads", "before_update", "update", "schedule"), (name, moment)
