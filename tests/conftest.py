import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_simplefsdp.paths import cache_root

from helpers import BASETEMP, slurm_jobs

pytest_plugins = ["pytester", "leftovers"]

TIERS = {
    "inproc": "in-process: no subprocess pytest, no rank",
    "fake": "fake ranks: pytest runs of small fake targets (the harness end to end)",
    "real": "real torchtitan cells on CPU (minutes each)",
    "slurm": "through a real single-node SLURM (tests/slurm/up.sh)",
    "main": "torchtitan main, the head of the bundle of its newest commits (tox -e main)",
    "e2e": "long real comparisons and the benchmarks run as tests: tox -e e2e (not in .ci/run)",
}


def pytest_configure(config):
    # pytester gives each inner session a fresh HOME, so each redid the per-user cache's work (the known-failures
    # check expands every shipped profile: ~3 s a session, ~1/3 of the fake tier's CPU). Its entries are keyed by
    # what they depend on, so the suite's sessions share the user's cache, as a user's own sessions do; a test
    # that needs a cold cache sets XDG_CACHE_HOME itself.
    os.environ.setdefault("XDG_CACHE_HOME", str(cache_root().parent))
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if os.environ.get("SIMPLEFSDP_CI_BUDGET_OUT"):  # benchmarks/ci_budget.py: each test's wall and CPU, recorded
        spec = importlib.util.spec_from_file_location(
            "ci_probe", Path(__file__).parent.parent / "benchmarks/ci_probe.py"
        )
        probe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe)
        config.pluginmanager.register(probe, "ci_probe")


@pytest.fixture
def run_matrix(pytester):
    """Write a matrix file and run pytest on it in a subprocess; returns the RunResult. New failures are not
    confirmed by reruns here (--simplefsdp-confirm=1) unless a test asks: the fakes fail the same way every time."""

    def run(text, *args, name="fake.yaml", launcher="local"):
        path = pytester.path / name
        path.write_text(text)
        confirm = [] if any(str(a).startswith("--simplefsdp-confirm") for a in args) else ["--simplefsdp-confirm=1"]
        return pytester.runpytest_subprocess(
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={path}",
            f"--simplefsdp-launcher={launcher}",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}",
            *confirm,
            *args,
        )

    return run


@pytest.fixture
def python():
    return sys.executable


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory):
    BASETEMP.append(str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def _kept_jobs(tmp_path_factory):
    """One reuse folder for the whole test run (both xdist workers: their basetemps' parent)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kept-jobs"


@pytest.fixture(autouse=True)
def _real_sessions_share_kept_jobs(request, monkeypatch):
    """The real tiers' inner sessions (and the main tier's runs in its checkout) keep their seeds and baselines in
    one folder (--simplefsdp-reuse-dir): a job's key holds all it depends on, so a seed or baseline that several
    tests' cells need is made once per test run, as in one user's runs, not once per test. Fresh per test run, so
    every job is still made by this code; e2e tests (which time or count cold runs) keep their own."""
    if request.node.get_closest_marker("real") is None or request.node.get_closest_marker("e2e") is not None:
        return
    shared = request.getfixturevalue("_kept_jobs")
    if "pytester" in request.fixturenames:  # (pytester drops PYTEST_ADDOPTS when it is set up: after it, then)
        request.getfixturevalue("pytester")
    addopts = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{addopts} -o simplefsdp_reuse_dir={shared}".strip())


SLURM_UP = Path(__file__).parent / "slurm" / "up.sh"
SLURM_LOCK = "/tmp/simplefsdp-slurm-up.lock"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items):
    """Each test in one tier (TIERS): SLURM where it needs it, real or e2e where its module or itself says so, fake
    where it runs pytest on fake targets, else in-process. Every test that needs SLURM in one xdist group: its two
    nodes run one test's jobs at a time, and a test waiting in the queue behind another worker's would run into its
    own timeouts."""
    for item in items:
        if not hasattr(item, "fixturenames"):  # (the repo's own matrix cells, when this conftest is loaded with them)
            continue
        params = getattr(item, "callspec", None) and item.callspec.params
        needs_slurm = {"slurm", "slurm_conf"} & set(item.fixturenames) or (params or {}).get("launcher") == "slurm"
        if needs_slurm:
            item.add_marker(pytest.mark.xdist_group("slurm"))
            item.add_marker(pytest.mark.slurm)
        elif not any(item.get_closest_marker(t) for t in ("real", "e2e", "fake", "inproc")):
            fake = {"pytester", "run_matrix"} & set(item.fixturenames)
            item.add_marker(pytest.mark.fake if fake else pytest.mark.inproc)


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
