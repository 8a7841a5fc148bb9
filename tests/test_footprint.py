"""Footprints: what a rank of a cell ran, recorded in the rank (shim/footprint.py, here in a real Python process that
runs a fake target's functions), and a diff's changed functions (spec/footprint.py) matched against it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pytest_simplefsdp.paths import SHIM_DIR
from pytest_simplefsdp.spec.footprint import FileChange, Footprint, changed_units, file_changes, of_ranks, reaches

pytestmark = pytest.mark.fake

MODULE = textwrap.dedent(
    """\
    import functools

    LIMIT = 3


    def used(x):
        return helper(x) + 1


    def helper(x):
        return [i for i in range(x)][-1]


    def unused(x):
        return x - 1


    class Model:
        scale = 2

        @functools.lru_cache(maxsize=None)
        def forward(self, x):
            def inner(y):
                return y * self.scale

            return inner(x)

        def backward(self, x):
            return x
    """
)


def lines_of(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def edit(text, needle, new):
    """The text with the line holding ``needle`` replaced, and its one -U0 hunk."""
    n = lines_of(text, needle)
    out = text.splitlines()
    out[n - 1] = new
    return "\n".join(out) + "\n", [(n, 1, n, 1)]


@pytest.mark.parametrize(
    "needle, new, expected",
    [
        ("return x - 1", "    return x - 2", (False, {"unused"})),
        (
            "return y * self.scale",
            "                return y * self.scale * 1",
            (False, {"Model.forward.<locals>.inner"}),
        ),
        ("return inner(x)", "        return inner(x) + 0", (False, {"Model.forward"})),
        ("def inner(y):", "        def inner(y, z=0):", (False, {"Model.forward"})),  # a nested signature: its parent
        ("def unused(x):", "def unused(x, y=0):", (True, set())),  # a module-level signature: the whole file
        ("@functools.lru_cache", "    @functools.lru_cache(maxsize=8)", (True, set())),  # a decorator
        ("scale = 2", "    scale = 3", (True, set())),  # a class body
        ("LIMIT = 3", "LIMIT = 4", (True, set())),  # a module-level statement
        ("return x - 1", "    return x -", (True, set())),  # no longer parses
    ],
)
def test_a_changed_line_belongs_to_the_innermost_function_whose_body_holds_it(needle, new, expected):
    after, hunks = edit(MODULE, needle, new)
    whole, units = changed_units(MODULE, after, hunks)
    assert (whole, set(units)) == expected


def test_lines_added_and_removed_are_placed_in_their_own_side():
    after = MODULE.replace("def unused(x):\n    return x - 1\n", "def unused(x):\n    y = x\n    return y - 1\n")
    at = lines_of(MODULE, "return x - 1")
    # line `at` removed (old side), two lines added from `at` (new side)
    assert changed_units(MODULE, after, [(at, 1, at, 2)]) == (False, frozenset({"unused"}))
    removed = MODULE.replace("        def backward(self, x):\n            return x\n", "")
    at = lines_of(MODULE, "def backward")
    assert changed_units(MODULE, removed, [(at, 2, at - 1, 0)]) == (True, frozenset())  # a method gone: class body


DIFF = """\
diff --git a/torchtitan/a.py b/torchtitan/b.py
similarity index 90%
rename from torchtitan/a.py
rename to torchtitan/b.py
index 1..2 100644
--- a/torchtitan/a.py
+++ b/torchtitan/b.py
@@ -3 +3 @@ def f():
-    return 1
+    return 2
diff --git a/torchtitan/gone.py b/torchtitan/gone.py
deleted file mode 100644
--- a/torchtitan/gone.py
+++ /dev/null
@@ -1,2 +0,0 @@
-x = 1
-y = 2
diff --git a/torchtitan/m.py b/torchtitan/m.py
--- a/torchtitan/m.py
+++ b/torchtitan/m.py
@@ -6,0 +7 @@ def used(x):
+    x = x + 0
diff --git a/tests/assets/tokenizer/tokenizer.json b/tests/assets/tokenizer/tokenizer.json
Binary files a/tests/assets/tokenizer/tokenizer.json and b/tests/assets/tokenizer/tokenizer.json differ
"""


def test_a_diff_names_renamed_and_deleted_files_at_their_old_names():
    def source(path):
        return MODULE if path == "torchtitan/m.py" else None

    changes = {c.path or c.old_path: c for c in file_changes(DIFF, source, source, untracked=["torchtitan/new.py"])}
    assert changes["torchtitan/b.py"] == FileChange("torchtitan/b.py", "torchtitan/a.py", True)
    assert changes["torchtitan/b.py"].names == ["torchtitan/a.py", "torchtitan/b.py"]
    assert changes["torchtitan/gone.py"] == FileChange(None, "torchtitan/gone.py", True)
    assert changes["torchtitan/m.py"] == FileChange("torchtitan/m.py", "torchtitan/m.py", False, frozenset({"used"}))
    assert changes["tests/assets/tokenizer/tokenizer.json"].whole
    assert changes["torchtitan/new.py"] == FileChange("torchtitan/new.py", None, True)


def test_a_change_reaches_a_footprint_by_file_function_listing_and_named_tree():
    fp = Footprint(
        frozenset({"torchtitan/m.py", "torchtitan/a.py"}),
        {"torchtitan/m.py": frozenset({"<module>", "used", "helper", "helper.<locals>.<listcomp>"})},
        listed=frozenset({"torchtitan/plugins"}),
        trees=frozenset({"tests/assets/tokenizer"}),
    )
    assert reaches(fp, FileChange("torchtitan/m.py", "torchtitan/m.py", False, frozenset({"helper"})))
    assert not reaches(fp, FileChange("torchtitan/m.py", "torchtitan/m.py", False, frozenset({"unused"})))
    assert reaches(fp, FileChange("torchtitan/m.py", "torchtitan/m.py", True))
    assert reaches(fp, FileChange("torchtitan/b.py", "torchtitan/a.py", True))  # renamed: its old name ran
    assert not reaches(fp, FileChange("torchtitan/other.py", "torchtitan/other.py", True))
    assert reaches(fp, FileChange("torchtitan/plugins/new.py", None, True))  # added to a folder a rank listed
    assert not reaches(fp, FileChange("torchtitan/plugins/deep/new.py", None, True))  # not in it
    assert reaches(
        fp, FileChange("tests/assets/tokenizer/tokenizer.json", "tests/assets/tokenizer/tokenizer.json", True)
    )
    floor = Footprint(fp.files, fp.functions, complete=False)  # dynamo compiled what it did not say: files count whole
    assert reaches(floor, FileChange("torchtitan/m.py", "torchtitan/m.py", False, frozenset({"unused"})))


def run_rank(tmp_path, script, rank=0, env=None):
    """A real Python process started as a rank is (the start-up shim first on its path), under a fake checkout."""
    evidence = tmp_path / "evidence"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIM_DIR), str(tmp_path / "checkout")]),
        "SIMPLEFSDP_FOOTPRINT": str(tmp_path / "checkout"),
        "SIMPLEFSDP_EVIDENCE_DIR": str(evidence),
        "RANK": str(rank),
        **(env or {}),
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return evidence


@pytest.fixture
def fake_checkout(tmp_path):
    pkg = tmp_path / "checkout" / "torchtitan"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(MODULE)
    (pkg / "untouched.py").write_text("def f():\n    return 1\n")
    (tmp_path / "checkout" / ".git").mkdir()  # a checkout: its every file counts, not torchtitan/ alone
    data = tmp_path / "checkout" / "tests" / "assets" / "c4_test"
    data.mkdir(parents=True)
    (data / "part0.json").write_text("{}")
    return tmp_path


def test_a_rank_records_the_functions_that_ran_and_the_files_it_read(fake_checkout):
    data = fake_checkout / "checkout" / "tests" / "assets" / "c4_test"
    script = (
        "import os, torchtitan.m as m\n"
        f"m.used(3); m.Model().forward(2); os.listdir({str(data)!r}); open({str(data / 'part0.json')!r}).read()\n"
    )
    for rank in (0, 1):
        evidence = run_rank(fake_checkout, script, rank)
    doc = json.loads((evidence / "footprint.rank0.json").read_text())
    assert doc["functions"]["torchtitan/m.py"] == [
        "<module>",
        "Model",
        "Model.forward",
        "Model.forward.<locals>.inner",
        "helper",
        "helper.<locals>.<listcomp>",
        "used",
    ]
    assert "torchtitan/untouched.py" not in doc["files"]
    assert "tests/assets/c4_test/part0.json" in doc["files"] and doc["listed"] == ["tests/assets/c4_test"]
    fp = of_ranks(evidence, 2, named=["tests/assets/tokenizer"])
    assert fp.trees == {"tests/assets/tokenizer"} and fp.complete
    assert of_ranks(evidence, 3) is None  # rank 2 left no record: no footprint for the run
