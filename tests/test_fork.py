"""The fork launcher: same verdicts and losses as the other launchers, no orphans, fallback."""

import json
import sys

import pytest

from helpers import FAKE_RANK, fake_matrix, launcher_ready, marked, module_matrix
from pytest_simplefsdp.launch.fork import _ForkServer
from pytest_simplefsdp.targets import RankCommand


@pytest.mark.parametrize("launcher", ["auto", "fork", "local", "torchrun"])
def test_the_fault_fakes_get_the_same_verdicts_under_every_launcher(run_matrix, pytester, launcher):
    """auto is fork here (a CPU profile); torchrun is the reference: each launcher must give exactly this.
    The timeout only ends the hang cell; the others end on their own, so it is long enough for a loaded
    machine (5 s once failed the passing cell under torchrun beside a CPU-heavy job)."""
    out = pytester.path / f"{launcher}.json"
    result = run_matrix(module_matrix(["pass", "fail", "segv", "exit3", "hang", "noresult"], timeout=30),
                        f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(passed=1, failed=5)
    cells = {c["id"]: c for c in json.loads(out.read_text())["runs"][0]["cells"]}
    got = {cid: (c["failure_class"], c["failing_rank"]) for cid, c in cells.items()}
    assert got == {"pass-r2": (None, None), "fail-r2": ("runtime", 1), "segv-r2": ("crash", 1),
                   "exit3-r2": ("runtime", 1), "hang-r2": ("hang", 0), "noresult-r2": ("no_result", None)}
    assert {c["launcher"] for c in cells.values()} == {"fork" if launcher == "auto" else launcher}
    assert cells["fail-r2"]["error_line"] == "RuntimeError: fake failure on purpose"
    assert cells["pass-r2"]["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    assert cells["pass-r2"]["grad_norms"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert "Current thread" in open(cells["hang-r2"]["rank_logs"]["1"][0]).read()  # stacks dumped
    assert "Fatal Python error: Segmentation fault" in open(cells["segv-r2"]["rank_logs"]["1"][0]).read()
    for cid in cells:
        assert not marked(cid)
    assert not marked("forkserver:")


def test_fork_falls_back_for_scripts_and_says_so(run_matrix):
    result = run_matrix(fake_matrix(modes=["fail"]), launcher="fork")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fork launcher: not a `python -m module` program of this interpreter; "
                                 "ran under the local launcher*"])


@pytest.mark.parametrize("launcher", ["fork", "local", "torchrun", "slurm"])
def test_a_rank_that_closes_its_output_and_raises_fails(run_matrix, pytester, launcher, request):
    """Under fork this once recorded exit code 0 on every rank and passed the cell."""
    launcher_ready(request, launcher)
    out = pytester.path / "run.json"
    result = run_matrix(module_matrix(["closeraise"]), f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(failed=1)
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert (cell["failure_class"], cell["failing_rank"]) == ("runtime", 1), cell
    assert cell["exit_codes"]["1"] == 1
    if launcher == "fork":  # the server keeps fd 2, so the traceback still reaches the rank log
        assert cell["error_line"] == "RuntimeError: fake failure on purpose"
    assert not marked("closeraise-r2") and not marked("forkserver:")


def test_a_module_without_a_main_guard_runs_in_its_ranks_not_in_the_server(run_matrix, pytester):
    """The server imports what the entry module imports, never the module's own body."""
    (pytester.path / "unguarded_rank.py").write_text(
        "import os, sys\n"
        "print(f'unguarded body ran in pid {os.getpid()} rank {os.environ.get(\"RANK\")}', flush=True)\n"
        "for step in (1, 2, 3):\n"
        "    print(f'step: {step}  loss: {10.0 / step:8.5f}  grad_norm: 1.0', flush=True)\n")
    text = module_matrix(["pass"]).replace('"-m", "fake_rank"', '"-m", "unguarded_rank"').replace(
        str(FAKE_RANK.parent), str(pytester.path))
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher="fork")
    result.assert_outcomes(passed=1)
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert cell["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    assert not any("local launcher" in d for d in cell["details"])  # it really forked
    logs = [open(p).read() for paths in cell["rank_logs"].values() for p in paths]
    assert all("unguarded body ran in pid" in log for log in logs)
    assert not marked("forkserver:")


def test_ranks_that_end_at_once_are_reported_to_the_cell(tmp_path):
    """The server reports a rank that ends at once on the line right after the ranks' pids. The launcher's reader
    once took that line before the cell had its ranks, died of a KeyError, and the cell waited for the rank
    forever (a CI run beside a CPU-heavy job hung 28 min in a fake cell). Many instant cells on one server, whose
    entry module imports one that prints at import (not the server's protocol: skipped, not a failed start)."""
    (tmp_path / "noisy_at_import.py").write_text("print('a word from an import', flush=True)\n")
    (tmp_path / "instant_rank.py").write_text("import os, sys\nimport noisy_at_import\n"
                                             "sys.exit(int(os.environ['RANK']) + 3)\n")
    server = _ForkServer(RankCommand([sys.executable, "-m", "instant_rank"], {"PYTHONPATH": str(tmp_path)},
                                     str(tmp_path)), ["instant_rank"], "instant")
    try:
        for cell in range(300):
            logs = [str(tmp_path / f"cell{cell}-rank{r}.log") for r in (0, 1)]
            ranks = server.start({"module": "instant_rank", "args": [], "envs": [{"RANK": "0"}, {"RANK": "1"}],
                                  "logs": logs, "cwd": str(tmp_path)})
            assert [ranks[r].wait(timeout=30) for r in (0, 1)] == [3, 4], f"cell {cell}"
    finally:
        server.close()
    assert server.proc.poll() is not None


def test_a_rank_of_a_server_that_died_is_not_waited_for_forever(tmp_path):
    """Its ranks die with the server (PR_SET_PDEATHSIG): a rank the server can no longer report ends as killed."""
    (tmp_path / "slow_rank.py").write_text("import time\ntime.sleep(600)\n")
    server = _ForkServer(RankCommand([sys.executable, "-m", "slow_rank"], {"PYTHONPATH": str(tmp_path)},
                                     str(tmp_path)), ["slow_rank"], "slow")
    try:
        ranks = server.start({"module": "slow_rank", "args": [], "envs": [{"RANK": "0"}],
                              "logs": [str(tmp_path / "rank0.log")], "cwd": str(tmp_path)})
        server.proc.kill()
        assert ranks[0].wait(timeout=30) == -9
    finally:
        server.close()


def test_a_server_whose_imports_block_fails_the_cell_at_its_timeout(run_matrix, pytester):
    """The server imports what the entry module imports; one that never returns once held the run with no clock
    running (the cell's starts after the server is up)."""
    (pytester.path / "blocks_at_import.py").write_text("import time\ntime.sleep(600)\n")
    (pytester.path / "blocked_rank.py").write_text("import blocks_at_import\n")
    text = module_matrix(["pass"], timeout=5).replace('"-m", "fake_rank"', '"-m", "blocked_rank"').replace(
        str(FAKE_RANK.parent), str(pytester.path))
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher="fork")
    result.assert_outcomes(failed=1)
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert cell["failure_class"] == "infra", cell
    assert "fork server did not start (preloading blocked_rank): still importing after 5 s" in cell["error_line"]
    assert not marked("forkserver:")
