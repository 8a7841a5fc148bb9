"""Our own hooks, implemented by a conftest: a target and a launcher the package does not know, cells
changed after expansion, every record seen, and one more report format."""

import json

from helpers import FAKE_RANK, run_doc

CONFTEST = '''
import json
import sys
from pathlib import Path

from pytest_simplefsdp.spec.cells import Dropped
from pytest_simplefsdp.launch.local import LocalLauncher
from pytest_simplefsdp.targets import CommandTarget, RankCommand


class Echo(CommandTarget):
    """A target of our own: the fake rank in a mode chosen by the cell, no command template."""

    name = "echo"
    spelling = "the conftest's own"

    def __init__(self, matrix):
        self.matrix, self.expects, self.MUTANTS = matrix, {}, ()

    def command(self, cell, dump_folder, **_):
        return RankCommand([sys.executable, "FAKE_RANK", "--mode", cell.axes["mode"], "--dump", str(dump_folder)], {})


class Counting(LocalLauncher):
    name = "counting"
    launched = []

    def launch(self, spec):
        Counting.launched.append(spec.cell_id)
        Path("launched.txt").write_text(" ".join(Counting.launched))
        return super().launch(spec)


def pytest_simplefsdp_make_target(matrix, cache_dir):
    if matrix.target == "echo":
        return Echo(matrix)


def pytest_simplefsdp_make_launcher(config, name, dry_run):
    if name == "counting":
        return Counting()


def pytest_simplefsdp_modify_cells(config, matrix, cells, dropped):
    if matrix.target != "echo":  # called for every matrix loaded, the shipped profiles too
        return
    for cell in [c for c in cells if c.axes["mode"] == "fail"]:
        cells.remove(cell)
        dropped.append(Dropped(cell.id, cell.axes, cell.world, "conftest", "the conftest says no"))


def pytest_simplefsdp_cell_result(config, record):
    with open("records.txt", "a") as f:
        f.write(record["type"] + " " + record["id"] + " " + record["status"] + "\\n")


def pytest_simplefsdp_report(config, doc):
    Path("custom.txt").write_text(json.dumps([c["id"] for c in doc["runs"][0]["cells"]]))
'''.replace("FAKE_RANK", str(FAKE_RANK))

MATRIX = """\
profile: hooks
target: echo
device: cpu
world_sizes: [2]
axes:
  mode: [pass, fail, nan]
"""


def test_a_conftest_adds_a_target_a_launcher_and_sees_every_result(pytester):
    pytester.makeconftest(CONFTEST)
    (pytester.path / "hooks.yaml").write_text(MATRIX)
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-matrix-file=hooks.yaml",
        "--simplefsdp-launcher=counting",
        f"--simplefsdp-json={out}",
        "-v",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*target=echo * flags=the conftest's own launcher=counting*",
            "*hooks.yaml::pass PASSED*",
            "*hooks.yaml::nan FAILED*",
            "*2 of 2 valid cells run*; 1 combination n/a*",
        ]
    )
    # a new failure is run once more before it counts (--simplefsdp-confirm=2, the default): one record still
    assert (pytester.path / "launched.txt").read_text() == "pass nan nan/confirm2"
    assert (pytester.path / "records.txt").read_text().splitlines() == ["cell pass passed", "cell nan failed"]
    assert json.loads((pytester.path / "custom.txt").read_text()) == ["pass", "nan"]
    dropped = run_doc(out)["dropped"]
    assert [(d["id"], d["rule"], d["reason"]) for d in dropped] == [("fail", "conftest", "the conftest says no")]


def test_without_an_implementation_the_names_stay_unknown(pytester):
    (pytester.path / "hooks.yaml").write_text(MATRIX)
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-matrix-file=hooks.yaml")
    result.stderr.fnmatch_lines(
        [
            "*hooks.yaml:2: unknown target 'echo'; built in: titan03, titan02, or "
            "{command: [[]...[]]} (plugins add more: pytest_simplefsdp_make_target)*"
        ]
    )
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-launcher=counting")
    result.stderr.fnmatch_lines(
        [
            "*unknown launcher 'counting'; built in: auto, torchrun, local, fork, slurm "
            "(plugins add more: pytest_simplefsdp_make_launcher)*"
        ]
    )


def test_the_slurm_launcher_is_a_plugin_of_its_own(pytester):
    """Its options and its launcher come through the same hooks a third party's would: blocked with -p no:,
    both are gone, and the rest of the plugin works without it."""
    (pytester.path / "hooks.yaml").write_text(MATRIX)
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    assert "--simplefsdp-slurm-partition" in help_text and "--simplefsdp-matrix" in help_text
    blocked = ["-p", "no:simplefsdp_slurm"]
    help_text = pytester.runpytest_subprocess("--help", *blocked).stdout.str()
    assert "--simplefsdp-slurm-partition" not in help_text and "--simplefsdp-matrix" in help_text
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-launcher=slurm", *blocked)
    result.stderr.fnmatch_lines(["*unknown launcher 'slurm'*"])
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", "--simplefsdp-matrix-file=hooks.yaml", "--simplefsdp-launcher=counting", *blocked
    )
    result.assert_outcomes(passed=1, failed=1)
