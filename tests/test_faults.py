"""Fault injection on fake targets: every fault classified, no orphan process, no lost result."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from pytest_simplefsdp.judge.results import build_result
from pytest_simplefsdp.launch import procs as launch
from pytest_simplefsdp.launch.procs import MARKER, kill_procs, session_leftovers
from pytest_simplefsdp.launch.spec import LaunchOutcome, LaunchSpec
from pytest_simplefsdp.launch.torchrun import TorchrunLauncher, read_root_cause
from pytest_simplefsdp.spec.cells import Cell
from pytest_simplefsdp.targets import RankCommand

from helpers import DATA, FAKE_RANK, fake_matrix, interruptible, launcher_ready, lingering, marked, ours, run_doc


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_output_flood_is_capped(run_matrix, pytester, launcher):
    text = fake_matrix(modes=["flood"], args=', "--flood-mb", "200"', timeout=120)
    out = pytester.path / "run.json"
    result = run_matrix(text, "--simplefsdp-log-limit=8", f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*flood-r2: [[]runtime[]] log output passed the limit of 8 MB; the cell was "
            "stopped and its logs were cut (ranks that wrote past it: 1)*",
            "  first failing rank: 1*",
        ]
    )
    assert run_doc(out)["cells"][0]["failing_rank"] == 1
    logs = list((pytester.path / "runs" / "fake" / "flood-r2").rglob("*.log"))
    assert sum(p.stat().st_size for p in logs) < 16 * 2**20
    assert any(p.read_bytes().endswith(b"passed the log limit\n") for p in logs)
    assert not marked("flood-r2")


def test_target_that_is_not_executable(run_matrix, pytester):
    script = pytester.path / "not_executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    text = fake_matrix().replace('["{python}", "' + str(FAKE_RANK) + '"', f'["{script}"')
    result = run_matrix(text)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*pass-r2: [[]infra[]] cannot start '{script}': Permission denied*"])


def test_world_size_larger_than_the_machine(run_matrix):
    result = run_matrix(fake_matrix(ranks=[3]), "--simplefsdp-max-ranks=2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pass-r3: [[]infra[]] 3 ranks do not fit this machine: at most 2*"])


def test_port_already_in_use_is_named(tmp_path):
    """torchrun's store cannot bind the rendezvous port: an infra failure that names the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        command = RankCommand([sys.executable, str(FAKE_RANK), "--dump", str(tmp_path / "d")])
        spec = LaunchSpec("port-r2", command, 2, tmp_path / "logs", timeout=120, port=port)
        outcome = TorchrunLauncher().launch(spec)
    result = build_result(Cell("port-r2", {}, 2), outcome, spec.log_dir, 3)
    assert result.status == "failed" and result.failure_class == "infra", result
    assert result.error_line.startswith(f"rendezvous port {port} is already in use: ")
    assert not marked("port-r2")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_cell_and_keeps_finished_results(pytester, sig):
    """SIGTERM to pytest acts as Ctrl-C does: the running cell is killed, the partial table is printed."""
    path = pytester.path / "fake.yaml"
    path.write_text(fake_matrix(modes=["pass", "hang"], timeout=600))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={path}",
            "--simplefsdp-launcher=local",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        logs = [pytester.path / "runs" / "fake" / "hang-r2" / f"rank{r}.log" for r in (0, 1)]
        deadline = time.monotonic() + 60
        while not all(p.exists() and "fake rank" in p.read_text() for p in logs):  # both ranks are up
            assert time.monotonic() < deadline, "the hang cell never started"
            time.sleep(0.1)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED
    assert "pass      pass" in out and "KeyboardInterrupt" in out  # the partial table
    records = [json.loads(line) for line in (pytester.path / "runs" / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records if r["type"] == "cell"] == ["pass-r2"]
    assert not marked("hang-r2")


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_sigkill_of_pytest_keeps_finished_results_and_orphans_die(pytester, launcher):
    path = pytester.path / "fake.yaml"
    path.write_text(fake_matrix(modes=["pass", "hang"], timeout=600))
    runs = pytester.path / "runs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={path}",
            f"--simplefsdp-launcher={launcher}",
            f"--simplefsdp-artifacts={runs}",
        ],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(marked("hang-r2")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    assert not lingering("hang-r2", within=30)  # ranks die with their runner (its reaper kills them)
    rendered = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report", str(runs / "results.jsonl")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "1 of 2 valid cells run (1 passed)" in rendered and "pass      pass" in rendered


def test_lingering_waits_for_a_killed_process_and_names_one_nobody_killed(tmp_path):
    """The tests' leak check allows a killed process time to go on a loaded machine, never a live one."""
    env = dict(os.environ, **{MARKER: "stray-r2:x"})
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, cwd=tmp_path)
    try:
        assert [p.pid for p in lingering("stray-r2", within=1)] == [stray.pid]  # nobody killed it: named
        stray.kill()
        assert lingering("stray-r2", within=10) == []
    finally:
        stray.kill()
        stray.wait()


def test_end_of_session_sweep_finds_and_kills_this_sessions_processes():
    env = dict(os.environ, **{MARKER: f"stray:{launch.SESSION}:x"})
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not [p for p in session_leftovers() if p.pid == stray.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        found = session_leftovers()
        assert [p.pid for p in found] == [stray.pid]
        kill_procs(found, grace=1)
        assert stray.wait(timeout=10) is not None and not session_leftovers()
    finally:
        stray.kill()


@pytest.mark.parametrize("launcher", ["local", "fork", "torchrun", "slurm"])
def test_the_first_failure_is_the_cause_when_a_peer_ignores_sigterm(run_matrix, pytester, launcher, request):
    """Rank 0 raises; rank 2 ignores SIGTERM and waits for it forever. The cell is rank 0's runtime error
    (not a hang of rank 2), and rank 2 is killed, not left to the cell timeout."""
    launcher_ready(request, launcher)
    text = fake_matrix(modes=["failignore"], ranks=[3], args=', "--rank", "2"', timeout=120)
    if launcher == "fork":  # the fork server runs `python -m module` programs
        text = text.replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"').replace(
            "target:\n", 'target:\n  env: {PYTHONPATH: "%s"}\n' % FAKE_RANK.parent
        )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*failignore-r3: [[]runtime[]] RuntimeError: fake failure on purpose*"])
    cell = run_doc(out)["cells"][0]
    assert cell["failing_rank"] == 0 and cell["failure_class"] == "runtime"
    assert not any("still running at the timeout" in d for d in cell["details"]), cell["details"]
    assert not marked("failignore-r3")


@pytest.mark.parametrize("launcher", ["local", "fork", "torchrun", "slurm"])
def test_a_hang_says_which_ranks_left_no_stack(run_matrix, pytester, launcher, request):
    """Rank 1 ignores SIGUSR1: its log has no stack, and the report says so instead of claiming every rank's."""
    launcher_ready(request, launcher)
    out = pytester.path / "run.json"
    text = fake_matrix(
        modes=["usr1ignore"], ranks=[2], args=', "--rank", "1"', timeout=5 if launcher == "local" else 30
    )
    result = run_matrix(as_module(text) if launcher == "fork" else text, f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(failed=1)
    cell = run_doc(out)["cells"][0]
    assert cell["failure_class"] == "hang" and cell["stuck_ranks"] == [0, 1]
    assert "Python stacks (SIGUSR1, faulthandler) are in the logs of ranks [0]; ranks [1] left none" in " ".join(
        cell["details"]
    )
    assert not marked("usr1ignore-r2")


def as_module(text):
    """The fake rank as `python -m fake_rank` (what the fork server runs)."""
    return text.replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"').replace(
        "target:\n", 'target:\n  env: {PYTHONPATH: "%s"}\n' % FAKE_RANK.parent
    )


def sleepers(seconds="97"):
    """The fake daemons of this session's runs (it keeps its working directory; another xdist worker's are not
    this test's)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.info["cmdline"] == ["sleep", seconds] and ours(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.parametrize("launcher", ["local", "fork", "torchrun", "slurm"])
def test_a_daemon_that_sheds_group_and_environment_is_found_and_killed(run_matrix, pytester, launcher, request):
    """setsid + double fork + execve with an empty environment: no process group, no marker; the runner is
    the child subreaper, so the daemon comes back to it and the after-cell sweep names and kills it."""
    launcher_ready(request, launcher)
    text = fake_matrix(modes=["daemon"])
    if launcher == "fork":
        text = text.replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"').replace(
            "target:\n", 'target:\n  env: {PYTHONPATH: "%s"}\n' % FAKE_RANK.parent
        )
    result = run_matrix(text, launcher=launcher)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*daemon-r2: [[]infra[]] 1 process(es) outlived their rank and were killed: pid * (sleep 97)*"]
    )
    assert not sleepers() and not marked("daemon-r2")


def _zombie(proc):
    """Wait until ``proc`` has exited but nobody has waited for it yet."""
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize(
    "left, first",
    [
        ({1: (10.0, None), 0: (11.2, None)}, 1),  # seen: rank 1 left first
        ({}, 0),  # not seen (torchrun ended first): torchrun's word
        ({1: (10.0, None), 0: (10.0, None)}, 0),
    ],  # one poll: torchrun's word
    ids=["rank-1-seen-first", "unseen", "same-poll"],
)
def test_torchrun_naming_a_peer_first_yields_to_the_rank_seen_leaving_first(tmp_path, left, first):
    """A real torchrun summary (tests/data): rank 1 killed, rank 0's 'connection closed' error file stamped before
    torchrun saw rank 1 gone, so torchrun named rank 0. Every failed rank keeps its code; the first failure is the
    rank the supervisor saw end first, as under the other launchers (a .ci/run here reported rank 0's SIGTERM)."""
    out = LaunchOutcome(launcher_log=tmp_path / "torchrun.log", left=dict(left))
    out.launcher_log.write_text((DATA / "titan03_torchrun_peer_named_first.log").read_text())
    read_root_cause(out, 1)
    assert out.exit_codes == {1: -9, 0: -15} and out.first_failed_rank == first and out.launcher_exit is None
    assert out.notes == (["torchrun named rank 0 as the first failure; rank 1 left 1.2 s before it"] if first else [])


def test_a_sweep_never_takes_the_exit_code_of_another_cells_rank():
    """Packed cells: one cell's orphan sweep ran while another cell's rank had just raised. The sweep
    reaped it, its Popen read exit code 0, and the cell became a hang of its waiting peer (CI, test_packing)."""
    rank = launch.spawn([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    own = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])  # e.g. tlparse, run by the runner itself
    _zombie(rank)
    _zombie(own)
    assert launch.orphans_since(set()) == []
    assert (rank.wait(timeout=10), own.wait(timeout=10)) == (3, 4)


def test_a_killed_rank_keeps_its_signal_as_exit_code():
    """kill_procs on a launcher's own child waits through its Popen: a rank stopped at the timeout
    reads -SIGTERM in the report, not the 0 a reaped child reads."""
    rank = launch.spawn(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert rank.stdout.readline() == b"up\n"  # it runs its sleep: the kill hits the running rank
    kill_procs([psutil.Process(rank.pid)], grace=5)
    assert rank.returncode == -signal.SIGTERM


LEFT_BEHIND = """\
import os


def test_runs_a_pytest_that_outlives_it(pytester):
    pytester.makepyfile(test_sleeper="import os, time\\n"
                                     "def test_sleep():\\n"
                                     "    open(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\\n"
                                     "    time.sleep(600)\\n")
    pytester.runpytest_subprocess()
"""


@pytest.mark.parametrize("plugin", ["leftovers", "no:leftovers"])
def test_a_timed_out_test_leaves_no_pytest_of_its_own_running(pytester, monkeypatch, tmp_path, plugin):
    """A test killed by pytest-timeout while pytester's inner pytest runs: with tests/leftovers.py that inner
    pytest is gone when the test ends; without it (the control) it would still be running."""
    pytest.importorskip("pytest_timeout")
    pidfile = tmp_path / "inner.pid"
    pytester.makepyfile(test_outer=LEFT_BEHIND)
    monkeypatch.setenv("PIDFILE", str(pidfile))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    )
    result = pytester.runpytest_subprocess(
        "-p", "pytester", "-p", plugin, "--timeout=15", "-p", "no:cacheprovider", timeout=120
    )
    result.assert_outcomes(failed=1)
    assert "Timeout" in result.stdout.str()
    try:
        inner = psutil.Process(int(pidfile.read_text()))  # the sleeping test's process
        alive = inner.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        inner, alive = None, False
    try:
        assert alive == (plugin == "no:leftovers"), plugin
    finally:
        if inner is not None:
            kill_procs([inner], grace=0)


def test_a_rank_killed_by_a_signal_once_runs_again_before_it_is_called_new(run_matrix, pytester):
    """By default (--simplefsdp-confirm=2) a crash by a signal runs once more: a SIGSEGV of one run is flaky, not
    new; one that crashes every run is new after its two runs."""
    from helpers import fake_matrix

    flag = pytester.path / "crashed-once"
    text = fake_matrix(modes=["segvonce", "segv"], args=f', "--flag", "{flag}"')
    result = run_matrix(text, "--simplefsdp-confirm=2")  # (the default; run_matrix passes 1 unless told)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*segvonce-r2: [[]crash[]] rank 1 killed by SIGSEGV*", "  flaky, new: passed 1 of 2 runs*"]
    )
    result.stdout.fnmatch_lines(
        ["*segv-r2: [[]crash[]] rank 1 killed by SIGSEGV*", "  new: failed in every one of 2 runs"]
    )
