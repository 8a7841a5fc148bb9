"""The session always finishes its report: a fork server that ends while cells run is noticed when it happens and
named in the summary (its exit and last stderr line), the cell it was running says so, later cells get a new
server, and the table, the JSON and the summary are all written; closing launchers tolerates what is already gone."""

import signal
import subprocess
import sys
import time

import pytest

from helpers import cells_of, marked, module_matrix

pytestmark = pytest.mark.fake


def test_a_fork_server_killed_mid_run_is_named_and_the_report_is_whole(pytester):
    matrix = pytester.path / "fake.yaml"
    matrix.write_text(module_matrix(["pass", "perturb", "fail"], args=', "--startup", "4"', timeout=60))
    out = pytester.path / "run.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={matrix}",
            "--simplefsdp-launcher=fork",
            f"--simplefsdp-json={out}",
            "--simplefsdp-confirm=1",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}",
            "-p",
            "no:cacheprovider",
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the second cell's ranks are up: kill the server under them
            if (pytester.path / "runs" / "fake" / "perturb-r2" / "rank1.log").exists() and marked("forkserver:"):
                break
            time.sleep(0.1)
        servers = marked("forkserver:")
        assert servers, "no fork server ran"
        for server in servers:
            server.send_signal(signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in stdout and "INTERNALERROR" not in stdout, stdout[-3000:]
    assert "simplefsdp: launcher incidents" in stdout, stdout[-3000:]
    assert "killed by SIGKILL" in stdout and "fork server pid" in stdout
    assert "simplefsdp composability" in stdout and "short test summary info" in stdout  # the table and summary
    cells = cells_of(out)
    assert set(cells) == {"pass-r2", "perturb-r2", "fail-r2"}  # every cell recorded, the JSON written
    perturb = cells["perturb-r2"]
    assert perturb["failure_class"] == "crash" and any("fork server pid" in d for d in perturb["details"]), perturb
    assert cells["fail-r2"]["failure_class"] == "runtime"  # a new server ran the cell after it
    assert not marked("forkserver:")


BROKEN_TARGET = '''
from pytest_simplefsdp.targets import CommandTarget


class Broken(CommandTarget):
    """A target with a bug of its own: its command cannot be built for one mode."""

    def command(self, cell, dump_folder, **kw):
        if cell.axes["mode"] == "fail":
            raise ValueError("a bug in the harness, not in the cell")
        return super().command(cell, dump_folder, **kw)


def pytest_simplefsdp_make_target(matrix, cache_dir):
    if matrix.profile == "fake":
        return Broken(matrix)
'''


def test_a_bug_of_the_plugin_on_one_cell_is_recorded_and_the_others_run(run_matrix, pytester):
    """An exception inside the plugin while it runs a cell: pytest shows its traceback, the cell's record says so
    (infra), the next cells run, and the table and JSON have every cell: no lost result."""
    pytester.makeconftest(BROKEN_TARGET)
    out = pytester.path / "run.json"
    from helpers import fake_matrix

    result = run_matrix(fake_matrix(modes=["pass", "fail", "nan"]), f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1, failed=2)
    cells = cells_of(out)
    assert list(cells) == ["pass-r2", "fail-r2", "nan-r2"]
    assert cells["fail-r2"]["failure_class"] == "infra"
    assert cells["fail-r2"]["error_line"] == (
        "pytest-simplefsdp failed on this cell: ValueError: a bug in the harness, not in the cell"
    )
    result.stdout.fnmatch_lines(
        ["*ValueError: a bug in the harness, not in the cell*", "*3 of 3 valid cells run (2 failed, 1 passed)*"]
    )
