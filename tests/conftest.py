import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pytest_simplefsdp.launch import MARKER

pytest_plugins = ["pytester"]

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


def marked(prefix):
    """Live processes whose cell marker starts with ``prefix`` (a cell id, or "forkserver:")."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER, "").startswith(prefix):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
