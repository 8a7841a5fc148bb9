"""The fork launcher: same verdicts and losses as the other launchers, no orphans, fallback."""

import sys

import pytest

from pytest_simplefsdp.launch.fork import _ForkServer
from pytest_simplefsdp.targets import RankCommand

from helpers import FAKE_RANK, cells_of, fake_matrix, launcher_ready, lingering, marked, module_matrix, run_doc

# every fault of the fake rank, and what each launcher must make of it: (status, failure class, failing rank)
FAULTS = {
    "pass": ("passed", None, None),
    "fail": ("failed", "runtime", 1),
    "segv": ("failed", "crash", 1),
    "kill": ("failed", "crash", 1),
    "exit3": ("failed", "runtime", 1),
    "closeraise": ("failed", "runtime", 1),
    "failignore": ("failed", "runtime", 0),
    "hang": ("failed", "hang", 0),
    "usr1ignore": ("failed", "hang", 0),
    "leave": ("failed", "hang", 1),
    "noresult": ("failed", "no_result", None),
    "flood": ("failed", "runtime", 1),
    "orphan": ("failed", "infra", None),
    "daemon": ("failed", "infra", None),
    "nan": ("failed", "numerics", None),
    "zerograd": ("failed", "numerics", None),
    "porttaken": ("passed", None, None),
}


def test_every_fault_gets_the_same_verdict_failure_class_and_failing_rank_under_every_launcher(
    run_matrix, pytester, request
):
    """The fault fakes, old and new, under fork (auto's choice on CPU), local, torchrun (the reference) and SLURM where
    it runs here: one table per launcher of each cell's outcome, failure class and failing rank, and the tables must
    be equal. A process that outlives its rank (orphan, daemon) fails a green cell as infra under every launcher; a
    rank that leaves early (leave) is named as the hang's cause. Cells run 8 at a time (the fakes wait, they do not
    compute); the timeout ends only the hanging cells."""
    launchers = ["fork", "local", "torchrun"]
    try:
        request.getfixturevalue("slurm")
        launchers.append("slurm")
    except pytest.skip.Exception:
        pass
    args = ', "--flood-mb", "8", "--flag", "{dump_folder}/../../portflag"'
    tables = {}
    for launcher in launchers:
        out = pytester.path / f"{launcher}.json"
        result = run_matrix(
            module_matrix(list(FAULTS), timeout=25, args=args),
            f"--simplefsdp-json={out}",
            "--simplefsdp-log-limit=4",
            "--simplefsdp-jobs=8",
            "--simplefsdp-max-ranks=16",
            f"--simplefsdp-artifacts={pytester.path / launcher}",
            launcher=launcher,
        )
        cells = cells_of(out)
        tables[launcher] = {
            cid.split("-")[0]: (c["status"], c["failure_class"], c["failing_rank"]) for cid, c in cells.items()
        }
        assert {c["launcher"] for c in cells.values()} == {launcher}
        assert cells["leave-r2"]["error_line"].startswith("timed out after "), cells["leave-r2"]["error_line"]
        assert "; rank 1 left first: it exited with code 0 after" in cells["leave-r2"]["error_line"] or (
            launcher in ("torchrun", "slurm")
            and "; rank 1 left first: it ended after" in cells["leave-r2"]["error_line"]
        )
        assert cells["orphan-r2"]["error_line"].startswith("1 process(es) outlived their rank and were killed")
        assert cells["pass-r2"]["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
        assert "Current thread" in open(cells["hang-r2"]["rank_logs"]["1"][0]).read()  # stacks dumped
        assert not lingering("forkserver:", *(f"{m}-r2" for m in FAULTS))
        result.assert_outcomes(passed=2, failed=len(FAULTS) - 2)
    assert tables["torchrun"] == FAULTS
    assert all(table == tables["torchrun"] for table in tables.values()), tables


def test_fork_falls_back_for_scripts_and_says_so(run_matrix):
    result = run_matrix(fake_matrix(modes=["fail"]), launcher="fork")
    result.assert_outcomes(failed=1)
    # the header says who will run the cells and why, the summary who ran them
    result.stdout.fnmatch_lines(
        [
            "*launcher=local (fork runs this target's program under local)",
            "*simplefsdp matrix fake.yaml (profile fake, target command, launcher local (asked: fork))*",
        ]
    )


@pytest.mark.parametrize("launcher", ["fork", "local", "torchrun", "slurm"])
def test_a_rank_that_closes_its_output_and_raises_fails(run_matrix, pytester, launcher, request):
    """Under fork this once recorded exit code 0 on every rank and passed the cell."""
    launcher_ready(request, launcher)
    out = pytester.path / "run.json"
    result = run_matrix(module_matrix(["closeraise"]), f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(failed=1)
    cell = run_doc(out)["cells"][0]
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
        "    print(f'step: {step}  loss: {10.0 / step:8.5f}  grad_norm: 1.0', flush=True)\n"
    )
    text = (
        module_matrix(["pass"])
        .replace('"-m", "fake_rank"', '"-m", "unguarded_rank"')
        .replace(str(FAKE_RANK.parent), str(pytester.path))
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher="fork")
    result.assert_outcomes(passed=1)
    cell = run_doc(out)["cells"][0]
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
    (tmp_path / "instant_rank.py").write_text(
        "import os, sys\nimport noisy_at_import\nsys.exit(int(os.environ['RANK']) + 3)\n"
    )
    server = _ForkServer(
        RankCommand([sys.executable, "-m", "instant_rank"], {"PYTHONPATH": str(tmp_path)}, str(tmp_path)),
        ["instant_rank"],
        "instant",
    )
    try:
        for cell in range(300):
            logs = [str(tmp_path / f"cell{cell}-rank{r}.log") for r in (0, 1)]
            ranks, _ = server.start(
                {
                    "module": "instant_rank",
                    "args": [],
                    "envs": [{"RANK": "0"}, {"RANK": "1"}],
                    "logs": logs,
                    "cwd": str(tmp_path),
                }
            )
            assert [ranks[r].wait(timeout=30) for r in (0, 1)] == [3, 4], f"cell {cell}"
    finally:
        server.close()
    assert server.proc.poll() is not None


def test_a_rank_of_a_server_that_died_is_not_waited_for_forever(tmp_path):
    """Its ranks die with the server (PR_SET_PDEATHSIG): a rank the server can no longer report ends as killed."""
    (tmp_path / "slow_rank.py").write_text("import time\ntime.sleep(600)\n")
    server = _ForkServer(
        RankCommand([sys.executable, "-m", "slow_rank"], {"PYTHONPATH": str(tmp_path)}, str(tmp_path)),
        ["slow_rank"],
        "slow",
    )
    try:
        ranks, _ = server.start(
            {
                "module": "slow_rank",
                "args": [],
                "envs": [{"RANK": "0"}],
                "logs": [str(tmp_path / "rank0.log")],
                "cwd": str(tmp_path),
            }
        )
        server.proc.kill()
        assert ranks[0].wait(timeout=30) == -9
    finally:
        server.close()


def test_a_server_whose_imports_block_fails_the_cell_at_its_timeout(run_matrix, pytester):
    """The server imports what the entry module imports; one that never returns once held the run with no clock
    running (the cell's starts after the server is up)."""
    (pytester.path / "blocks_at_import.py").write_text("import time\ntime.sleep(600)\n")
    (pytester.path / "blocked_rank.py").write_text("import blocks_at_import\n")
    text = (
        module_matrix(["pass"], timeout=5)
        .replace('"-m", "fake_rank"', '"-m", "blocked_rank"')
        .replace(str(FAKE_RANK.parent), str(pytester.path))
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher="fork")
    result.assert_outcomes(failed=1)
    cell = run_doc(out)["cells"][0]
    assert cell["failure_class"] == "infra", cell
    assert "fork server did not start (preloading blocked_rank): still importing after 5 s" in cell["error_line"]
    assert not marked("forkserver:")


@pytest.mark.parametrize("conf", ["ours", "jemalloc_default"])
def test_the_fork_server_forks_from_one_thread_with_pyarrow_loaded(tmp_path, conf):
    """pyarrow (torchtitan's data loading imports it) starts jemalloc's background thread when it loads; a child
    forked beside it has none, and a lock it held stays held. The server keeps to one thread; with jemalloc's own
    configuration (JE_ARROW_MALLOC_CONF set, empty) the thread is there, and the server names it."""
    pytest.importorskip("pyarrow")
    (tmp_path / "arrow_rank.py").write_text("import sys\nimport pyarrow\nsys.exit(0)\n")
    env = {"PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}  # as a CPU cell's (numpy's OpenBLAS: one thread)
    if conf == "jemalloc_default":
        env["JE_ARROW_MALLOC_CONF"] = ""
    server = _ForkServer(RankCommand([sys.executable, "-m", "arrow_rank"], env, str(tmp_path)), ["arrow_rank"], conf)
    try:
        ranks, others = server.start(
            {
                "module": "arrow_rank",
                "args": [],
                "envs": [{"RANK": "0"}],
                "logs": [str(tmp_path / "rank0.log")],
                "cwd": str(tmp_path),
            }
        )
        assert ranks[0].wait(timeout=60) == 0
    finally:
        server.close()
    assert others == ([] if conf == "ours" else ["jemalloc_bg_thd"])


def test_a_cell_forked_beside_another_thread_of_the_server_says_so(run_matrix, pytester):
    """A thread the entry module's imports start lives in the server; the cell's record names it."""
    (pytester.path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    (pytester.path / "threaded_rank.py").write_text("import starts_a_thread\nimport fake_rank\nfake_rank.main()\n")
    text = (
        module_matrix(["pass"])
        .replace('"-m", "fake_rank"', '"-m", "threaded_rank"')
        .replace(f'PYTHONPATH: "{FAKE_RANK.parent}"', f'PYTHONPATH: "{pytester.path}:{FAKE_RANK.parent}"')
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher="fork")
    result.assert_outcomes(passed=1)
    details = run_doc(out)["cells"][0]["details"]
    assert any(d.startswith("the fork server held 1 other thread when it forked these ranks") for d in details), details
