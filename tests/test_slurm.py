"""The SLURM launcher, against a real SLURM: tests/slurm/up.sh starts slurmctld and two slurmd nodes
(n1, n2) on this host's loopback. Tests that need it skip where SLURM can't be installed or started."""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from pytest_simplefsdp.launch.slurm import SlurmLauncher, SlurmOptions
from pytest_simplefsdp.launch.spec import LaunchSpec
from pytest_simplefsdp.targets import RankCommand

from helpers import cells_of, fake_matrix, interruptible, slurm_jobs

VERDICT = ("status", "failure_class", "failing_rank", "error_line", "stuck_ranks")


def table(result):
    """The composability table with its wall times and column padding taken out (a cell of 9 s and one of
    17 s pad the columns differently: the verdicts are what must match)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("layout"))
    return [
        " ".join(re.sub(r"-+", "-", re.sub(r" \d+s\b", "", line)).split())  # (dashes: as wide as the widest time)
        for line in lines[start : start + 6]
    ]


def test_srun_command_of_a_gpu_cell_spans_nodes(tmp_path):
    launcher = SlurmLauncher(SlurmOptions(partition="h100", account="titan", extra=["--qos=high"]))
    command = RankCommand([sys.executable, "-m", "torchtitan.train", "--module", "graph_trainer.llama3"], {})
    spec = LaunchSpec("llama3-dp16", command, 16, tmp_path, timeout=900, port=29500, device="cuda")
    argv = launcher.srun_argv(spec)
    for option in (
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--time=16",
        "--gres=gpu:8",
        "--partition=h100",
        "--account=titan",
        "--qos=high",
        "--kill-on-bad-exit=1",
    ):
        assert option in argv
    script = argv[-1]
    assert argv[-3:-1] == ["bash", "-c"]
    subprocess.run(["bash", "-n", "-c", script], check=True)  # the task's script parses
    for part in (
        "--nproc-per-node=8",
        "--nnodes=2",
        '--node-rank="$SLURM_NODEID"',
        '--master-addr="$addr"',
        f'--log-dir={tmp_path}/torchrun/node"$SLURM_NODEID"',
        "-m torchtitan.train --module graph_trainer.llama3",
        'scontrol show hostnames "$SLURM_STEP_NODELIST"',
    ):
        assert part in script
    # a folder with a space and a quote: the task still gets one word, with its node number
    odd_dir = tmp_path / "it's a dir"
    script = launcher.srun_argv(LaunchSpec("x", command, 16, odd_dir, 60, 1, device="cuda"))[-1]
    words = subprocess.run(
        ["bash", "-c", "SLURM_NODEID=1; addr=10.0.0.1; printf '%s\\n' " + script.split("exec ", 1)[1]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert f"--log-dir={odd_dir}/torchrun/node1" in words and "--master-addr=10.0.0.1" in words
    # 12 ranks of 8-GPU nodes: two nodes of 6; a CPU cell stays on one node and asks for no GPU
    assert launcher.layout(LaunchSpec("x", command, 12, tmp_path, 60, 1, device="cuda")) == (2, 6)
    cpu = launcher.srun_argv(LaunchSpec("x", command, 4, tmp_path, 60, 1))
    assert "--nodes=1" in cpu and not any(a.startswith("--gres") for a in cpu) and "addr=127.0.0.1" in cpu[-1]
    odd = SlurmLauncher(SlurmOptions(ranks_per_node=4)).launch(LaunchSpec("x", command, 7, tmp_path, 60, 1))
    assert odd.launch_error == (
        "7 ranks do not split evenly over 2 nodes of at most 4 ranks (--simplefsdp-slurm-ranks-per-node)"
    )


def test_bad_slurm_options_are_usage_errors(run_matrix):
    result = run_matrix(fake_matrix(), "--simplefsdp-slurm-args=--qos='high", launcher="slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['*--simplefsdp-slurm-args: No closing quotation: "--qos=\'high"*'])
    result = run_matrix(fake_matrix(), "--simplefsdp-slurm-ranks-per-node=2.5", launcher="slurm")
    result.stderr.fnmatch_lines(["*--simplefsdp-slurm-ranks-per-node: not a whole number: 2.5*"])


def test_ini_keys_reach_srun_in_a_dry_run(pytester):
    pytester.makeini(
        "[pytest]\nsimplefsdp_launcher = slurm\nsimplefsdp_slurm_partition = h100\n"
        "simplefsdp_slurm_account = titan\nsimplefsdp_slurm_args = --qos=high --exclusive\n"
    )
    path = pytester.path / "fake.yaml"
    path.write_text(fake_matrix(ranks=(4,)))
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        f"--simplefsdp-matrix-file={path}",
        "--simplefsdp-dry-run",
        "--simplefsdp-slurm-ranks-per-node=2",
    )
    result.stdout.fnmatch_lines(
        [
            "*launcher=slurm DRY RUN*",
            "* srun --job-name=simplefsdp:pass-r4 --nodes=2 --ntasks=2 * --partition=h100 "
            "--account=titan --qos=high --exclusive bash -c *--nnodes=2 *",
        ]
    )


def test_unknown_partition_is_a_usage_error(run_matrix, slurm):
    result = run_matrix(fake_matrix(), "--simplefsdp-slurm-partition=gpu", launcher="slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--simplefsdp-slurm-partition: no partition 'gpu' on this cluster; sinfo lists: cpu*"]
    )


def test_same_table_and_verdicts_as_the_local_launcher(run_matrix, pytester, slurm):
    """pass / fail / hang / crash cells of 2 ranks (one node) and 4 ranks (two nodes of 2), 4 steps at once;
    the last rank misbehaves (on the second node in the 4-rank cells). The timeout only ends the hang cells:
    long enough that four torchruns starting at once on a loaded machine finish their passing cells."""
    text = fake_matrix(modes=("pass", "fail", "hang", "segv"), ranks=(2, 4), timeout=40, args=', "--rank", "-1"')
    local = run_matrix(text, "--simplefsdp-json=local.json", f"--simplefsdp-artifacts={pytester.path / 'local'}")
    on_slurm = run_matrix(
        text,
        "--simplefsdp-json=slurm.json",
        f"--simplefsdp-artifacts={pytester.path / 'slurm'}",
        "--simplefsdp-slurm-ranks-per-node=2",
        "--simplefsdp-jobs=4",
        launcher="slurm",
    )
    for result in (local, on_slurm):
        result.assert_outcomes(passed=2, failed=6)
    assert table(on_slurm) == table(local)
    local_cells, cells = cells_of(pytester.path / "local.json"), cells_of(pytester.path / "slurm.json")
    for cell_id, cell in cells.items():
        assert {k: cell[k] for k in VERDICT} == {k: local_cells[cell_id][k] for k in VERDICT}, cell_id
        nodes = r"n[12]" if cell_id.endswith("-r2") else re.escape("n[1-2]")
        assert any(re.fullmatch(rf"SLURM step \d+\.\d+ on {nodes} \(queued \d+\.\d s\)", d) for d in cell["details"]), (
            cell["details"]
        )
        assert (
            " srun --job-name=simplefsdp:" in (pytester.path / "slurm" / "fake" / cell_id / "command.txt").read_text()
        )
    assert cells["hang-r4"]["error_line"].endswith("ranks still running: 0, 1, 2, 3")
    assert (cells["segv-r4"]["failing_rank"], cells["fail-r4"]["error_line"]) == (
        3,
        "RuntimeError: fake failure on purpose",
    )
    rank3 = "".join(open(p).read() for p in cells["hang-r4"]["rank_logs"]["3"])  # on the second node
    assert "/torchrun/node1/" in cells["hang-r4"]["rank_logs"]["3"][0] and "(most recent call first)" in rank3
    assert cells["pass-r4"]["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}


def test_cells_that_slurm_cannot_place_or_start(run_matrix, pytester, slurm):
    # one rank per node: a 2-rank cell runs on both nodes, a 4-rank cell asks for 4 of 2 nodes
    result = run_matrix(
        fake_matrix(ranks=(2, 4)), "--simplefsdp-json=run.json", "--simplefsdp-slurm-ranks-per-node=1", launcher="slurm"
    )
    result.assert_outcomes(passed=1, failed=1)
    cells = cells_of(pytester.path / "run.json")
    assert cells["pass-r2"]["status"] == "passed"
    assert (cells["pass-r4"]["failure_class"], cells["pass-r4"]["error_line"]) == (
        "infra",
        "SLURM did not run the cell (4 nodes of 1 rank): Unable to allocate resources: "
        "Node count specification invalid",
    )
    # a cell SLURM keeps queued is withdrawn after the queue timeout (the fixture checks nothing is left)
    result = run_matrix(
        fake_matrix(),
        "--simplefsdp-json=queued.json",
        "--simplefsdp-slurm-queue-timeout=3",
        "--simplefsdp-slurm-args=--begin=now+1hour",
        launcher="slurm",
    )
    result.assert_outcomes(failed=1)
    cell = cells_of(pytester.path / "queued.json")["pass-r2"]
    assert cell["failure_class"] == "infra"
    assert re.fullmatch(r"SLURM did not start the cell within 3 s \(job \d+ pending: BeginTime\)", cell["error_line"])


def start(pytester, text, *args):
    path = pytester.path / "fake.yaml"
    path.write_text(text)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={path}",
            "--simplefsdp-launcher=slurm",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )


def wait_for_running(names, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {name: job for job, name, state in slurm_jobs(wait=0) if state == "RUNNING"}
        if all(f"simplefsdp:{n}" in jobs for n in names):
            return [jobs[f"simplefsdp:{n}"] for n in names]
        time.sleep(0.2)
    raise AssertionError(f"{names} never ran; queue: {slurm_jobs(wait=0)}")


def wait_for_log_line(cell_dir, text, ranks, timeout=60):
    """Until ``ranks`` rank logs of the cell (torchrun's, under srun) contain ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = cell_dir.glob("torchrun/node*/*/attempt_*/*/stdout.log")
        if sum(text in p.read_text(errors="replace") for p in logs) >= ranks:
            return
        time.sleep(0.1)
    raise AssertionError(f"{ranks} ranks of {cell_dir.name} never logged {text!r}")


def test_step_cancelled_by_someone_else(pytester, slurm):
    proc = start(pytester, fake_matrix(modes=["hang"], timeout=300))
    try:
        [job] = wait_for_running(["hang-r2"])
        wait_for_log_line(pytester.path / "runs" / "fake" / "hang-r2", "fake rank", ranks=2)  # the ranks are up
        subprocess.run(["scancel", job], check=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert re.search(
        rf"hang-r2: \[infra\] SLURM cancelled the step: .*\*\*\* (STEP|JOB) {job}\S* ON n1 CANCELLED AT ", out
    ), out


def test_slurm_time_limit_is_a_hang(run_matrix, pytester, slurm):
    """SLURM's own limit (here a 1-minute --time, shorter than the cell timeout) ends the step."""
    result = run_matrix(
        fake_matrix(modes=["hang"], timeout=600),
        "--simplefsdp-json=run.json",
        "--simplefsdp-slurm-args=--time=1",
        launcher="slurm",
    )
    result.assert_outcomes(failed=1)
    cell = cells_of(pytester.path / "run.json")["hang-r2"]
    assert cell["failure_class"] == "hang" and cell["error_line"].startswith("timed out after")
    assert any(
        d.startswith("SLURM's time limit ended the step: ") and "DUE TO TIME LIMIT" in d for d in cell["details"]
    ), cell["details"]


def test_ctrl_c_cancels_the_submitted_steps_and_keeps_finished_results(pytester, slurm):
    proc = start(pytester, fake_matrix(modes=["pass", "hang"], ranks=(2, 4), timeout=600), "--simplefsdp-jobs=4")
    try:
        wait_for_running(["hang-r2", "hang-r4"])
        results, deadline = pytester.path / "runs" / "results.jsonl", time.monotonic() + 60
        while (not results.exists() or results.read_text().count('"type": "cell"') < 2) and time.monotonic() < deadline:
            time.sleep(0.2)  # the two passing cells are judged
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert not slurm_jobs(), out  # both running steps were cancelled
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records if r["type"] == "cell") == ["pass-r2", "pass-r4"]


def test_sigkill_of_pytest_cancels_its_step(pytester, slurm):
    """srun dies with its runner (SIGTERM by PR_SET_PDEATHSIG) and takes the step with it."""
    proc = start(pytester, fake_matrix(modes=["hang"], timeout=600))
    try:
        wait_for_running(["hang-r2"])
    finally:
        proc.kill()
    proc.communicate(timeout=30)
    assert not slurm_jobs()
