import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pytest_simplefsdp.launch import MARKER

pytest_plugins = ["pytester", "leftovers"]

FAKE_RANK = Path(__file__).parent / "fakes" / "fake_rank.py"


def fake_matrix(modes=("pass",), ranks=(2,), extra="", args="", steps=3, timeout=30):
    """A matrix file for the fake rank target: one axis `mode`, one degree axis `ranks`."""
    return textwrap.dedent(f"""\
        profile: fake
        target:
          command: ["{{python}}", "{FAKE_RANK}", "--mode", "{{mode}}", "--dump", "{{dump_folder}}",
                    "--steps", "{{steps}}" {args}]
        device: cpu
        world_sizes: {list(ranks)}
        degrees: [ranks]
        timeout: {timeout}
        settings:
          steps: {steps}
        axes:
          mode: {list(modes)}
          ranks: {list(ranks)}
        ids:
          ranks: {{prefix: r}}
        """) + textwrap.dedent(extra)


def module_matrix(modes, **kw):
    """The fake rank as `python -m fake_rank`, the form the fork server can preload and fork."""
    text = fake_matrix(modes=modes, **kw).replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"')
    return text.replace("target:\n", "target:\n  env: {PYTHONPATH: \"%s\"}\n" % FAKE_RANK.parent)


NUMERICS = """\
numerics:
  global_batch_size: 8
  baseline: {mode: pass}
  lanes:
    - name: close
      match: [{mode: perturb}, {mode: nan}]
      rtol: 1.0e-5
      atol: 1.0e-5
    - name: exact
"""  # the fake target's numerics: perturb and nan cells compared with pass


KF = """\
- id: fake-known
  when: {mode: fail}
  error: 'fake failure'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/pull/1529
  reason: a known fake failure
"""  # a known-failures file for the fake target's `fail` mode


def report_tool(*args, cwd=None):
    """python -m pytest_simplefsdp.report, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "pytest_simplefsdp.report", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def run_matrix(pytester):
    """Write a matrix file and run pytest on it in a subprocess; returns the RunResult."""

    def run(text, *args, name="fake.yaml", launcher="local"):
        path = pytester.path / name
        path.write_text(text)
        return pytester.runpytest_subprocess(
            "--simplefsdp-matrix", f"--simplefsdp-matrix-file={path}", f"--simplefsdp-launcher={launcher}",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}", *args)

    return run


@pytest.fixture
def python():
    return sys.executable


def interruptible():
    """preexec_fn of a pytest run that a test interrupts: SIGINT as a terminal delivers it (a background
    job of a non-interactive shell, as CI may be, starts with SIGINT ignored, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


BASETEMP = []  # this test session's tmp root: the runs its tests start live under it


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory):
    BASETEMP.append(str(tmp_path_factory.getbasetemp()))


def ours(p):
    """Whether a process belongs to a run this test session started (its cell's evidence folder or its working
    directory lies under the session's tmp root), not to another job on the machine with the same cell ids."""
    if not BASETEMP:
        return True
    env, root = p.environ(), os.path.join(BASETEMP[0], "")  # (a sibling /tmp/bt2 is not under /tmp/bt)
    return any(os.path.join(str(x), "").startswith(root) for x in (env.get("SIMPLEFSDP_EVIDENCE_DIR", ""), p.cwd()))


def marked(prefix):
    """Live processes of this session's runs whose cell marker starts with ``prefix`` (a cell id, or
    "forkserver:")."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER, "").startswith(prefix) and ours(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


SLURM_UP = Path(__file__).parent / "slurm" / "up.sh"
SLURM_LOCK = "/tmp/simplefsdp-slurm-up.lock"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items):
    """Every test that needs SLURM in one xdist group: its two nodes run one test's jobs at a time, and a test
    waiting in the queue behind another worker's would run into its own timeouts."""
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if {"slurm", "slurm_conf"} & set(getattr(item, "fixturenames", ())) or (params or {}).get("launcher") == "slurm":
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def slurm_conf():
    """A running SLURM on this machine (tests/slurm/up.sh: two slurmd nodes on loopback); skips where it can't."""
    with open(SLURM_LOCK, "w") as lock:  # pytest-xdist: each worker asks; one starts it, the others find it up
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=180)
    if proc.returncode == 3:  # not installed, or not root: the tests that need it can't run here
        pytest.skip(f"no SLURM here: {proc.stderr.strip()} (CI installs it: tests/slurm/up.sh --install)")
    assert proc.returncode == 0, f"tests/slurm/up.sh failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout.strip().rpartition("SLURM_CONF=")[2]


def launcher_ready(request, launcher):
    """For a test parametrized over launchers: SLURM up (or the test skipped) when it is the slurm one."""
    if launcher == "slurm":
        request.getfixturevalue("slurm")


@pytest.fixture
def slurm(slurm_conf, monkeypatch):
    """SLURM_CONF for this test's srun/squeue calls and the pytest runs it starts; no job may outlive it."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    yield slurm_conf
    assert not slurm_jobs(), "the test left SLURM jobs behind"


def slurm_jobs(wait=20.0):
    """(job id, name, state) of the plugin's jobs in SLURM's queue that runs of this test session submitted
    (their working directory lies under its tmp root; another session on the cluster has its own), once
    ending ones had `wait` s to go."""
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%Z"], capture_output=True, text=True).stdout
        jobs = [tuple(line.split("|")[:3]) for line in out.splitlines() if "|simplefsdp:" in line
                and (not BASETEMP or os.path.join(line.rpartition("|")[2], "").startswith(os.path.join(BASETEMP[0], "")))]
        if not jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)
