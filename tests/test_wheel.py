"""The plugin as a user gets it: the built wheel (not this checkout, not editable) installed with uv into a fresh
environment beside torch and torchtitan, run from a folder that is not this checkout."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_simplefsdp.machine import installed

from helpers import FAKE_RANK, fake_matrix

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.real


def run(argv, **kw):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The wheel and the sdist, built as a release would be, and checked as an index would check them."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO])
    run([sys.executable, "-m", "twine", "check", "--strict", *sorted(out.iterdir())])
    wheel = next(out.glob("*.whl"))
    return wheel, next(out.glob("*.tar.gz"))


def test_the_wheel_carries_what_the_plugin_reads_at_run_time(dist):
    wheel, sdist = dist
    names = zipfile.ZipFile(wheel).namelist()
    for path in (
        "pytest_simplefsdp/_data/matrix/cpu.yaml",
        "pytest_simplefsdp/_data/known_failures.yaml",
        "pytest_simplefsdp/_data/fixtures/cpu_shim/sitecustomize.py",
    ):
        assert path in names, path
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "pytest_simplefsdp").rglob("*.py")}
    assert modules - set(names) == set()  # every module (a build that walked a link first once left them all out)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Classifier: Framework :: Pytest" in meta and "License-Expression: BSD-3-Clause" in meta
    from pytest_simplefsdp import __version__

    assert f"Version: {__version__}\n" in meta and wheel.name.startswith(f"pytest_simplefsdp-{__version__}-")
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/entry_points.txt"))).decode()
    assert "simplefsdp = pytest_simplefsdp.plugin" in entry


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh environment: the torch and torchtitan this suite runs with, triton, and the wheel."""
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("uv is not installed (pip install uv: tox.ini's deps have it)")
    folder = tmp_path_factory.mktemp("venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([uv, "venv", "--quiet", "--python", sys.executable, folder], env=env)
    python = folder / "bin" / "python"
    run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            python,
            f"torch=={installed('torch').split('+')[0]}",
            f"torchtitan=={installed('torchtitan')}",
            "triton",
            dist[0],
        ],
        env=env,
        timeout=1800,
    )
    return python, env


@pytest.fixture
def project(tmp_path):
    """A folder that is not this checkout (as a user's torchtitan checkout would be), with a fake target."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(FAKE_RANK, folder / "fake_rank.py")
    (folder / "fake.yaml").write_text(
        fake_matrix(modes=["pass", "fail"]).replace(str(FAKE_RANK), str(folder / "fake_rank.py"))
    )
    (folder / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    return folder


def pytest_in(venv, folder, *args, timeout=1800):
    python, env = venv
    return subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_installed_wheel_runs_the_profile_a_fake_matrix_and_a_real_cell_from_another_folder(venv, project):
    python, _ = venv
    site = Path(
        run(
            [python, "-c", "import pytest_simplefsdp, os; print(os.path.dirname(pytest_simplefsdp.__file__))"],
            cwd=project,
            env=venv[1],
        ).stdout.strip()
    )
    assert not str(site).startswith(str(REPO)), site  # the wheel's copy, not this checkout's
    before = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)

    dry = pytest_in(venv, project, "--simplefsdp-matrix", "--simplefsdp-dry-run", "-q")
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert (
        "matrix/cpu.yaml::llama3-dp2-eager SKIPPED" in dry.stdout or "matrix/cpu.yaml::llama3-dp2-eager" in dry.stdout
    )
    assert re.search(r"\d+ skipped", dry.stdout)

    fake = pytest_in(
        venv, project, "--simplefsdp-matrix", "--simplefsdp-matrix-file=fake.yaml", "--simplefsdp-confirm=1"
    )
    assert fake.returncode == 1 and "1 failed, 1 passed" in fake.stdout, fake.stdout[-3000:]

    real = pytest_in(venv, project, "--simplefsdp-matrix", "-k", "llama3-dp2-eager and not fsdp2 and not spmd_types")
    assert real.returncode == 0, real.stdout[-5000:]
    assert "matrix/cpu.yaml::llama3-dp2-eager PASSED" in real.stdout
    assert list(project.glob(".simplefsdp/runs/*/results.jsonl"))  # the outputs: under the rootdir it ran in

    after = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    assert after == before  # nothing written into site-packages


def test_a_plain_pytest_run_does_not_load_the_controller(venv, project):
    python, env = venv
    proc = subprocess.run(
        [str(python), "-X", "importtime", "-m", "pytest", "-p", "no:cacheprovider", "test_plain.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert re.search(r"(?m)^plugins: .*simplefsdp-", proc.stdout)  # loaded: it adds its options, nothing else
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    ours = sorted(m for m in imported if m.startswith("pytest_simplefsdp"))
    assert "pytest_simplefsdp.options" in ours
    assert not any(
        m.startswith(
            (
                "pytest_simplefsdp.session",
                "pytest_simplefsdp.spec",
                "pytest_simplefsdp.judge",
                "pytest_simplefsdp.report",
            )
        )
        for m in ours
    ), ours
    assert not {"tabulate", "pydantic", "re2", "ruamel.yaml", "torch"} & imported
