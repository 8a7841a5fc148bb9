import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BASETEMP, slurm_jobs

pytest_plugins = ["pytester", "leftovers"]

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


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory):
    BASETEMP.append(str(tmp_path_factory.getbasetemp()))


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


@pytest.fixture
def slurm(slurm_conf, monkeypatch):
    """SLURM_CONF for this test's srun/squeue calls and the pytest runs it starts; no job may outlive it."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    yield slurm_conf
    assert not slurm_jobs(), "the test left SLURM jobs behind"
