"""The GPU check (benchmarks/gpu/run.sh: what a session runs in its one call on a lent GPU) rehearsed on CPU
(CPU_REHEARSAL=1: the same steps with no CUDA), so the script cannot rot between lent devices; and the wheels it
carries, downloaded for the device image's Python. Runs where torchtitan 0.2 is installed: tox -e titan022
(torchtitan 0.2.2 on torch 2.11.0, the lent GPU's pairing)."""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"

pytest.importorskip("torchtitan", reason="the GPU check runs torchtitan 0.2 (tox -e titan022)")
if not metadata.version("torchtitan").startswith("0.2."):
    pytest.skip("the lent GPU's image runs torchtitan 0.2 (tox -e titan022)", allow_module_level=True)


def test_the_wheels_for_the_device_image_fit_one_call(tmp_path):
    """What the image lacks, for its Python 3.12, and this plugin as a wheel: under the 60 MiB the script allows."""
    done = subprocess.run(
        ["bash", str(GPU / "wheels.sh"), str(tmp_path / "whl")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": "python3"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = sorted(p.name for p in (tmp_path / "whl").glob("*.whl"))
    assert any(w.startswith("torchtitan-0.2.2-") for w in wheels) and any(
        w.startswith("pytest_simplefsdp-") for w in wheels
    )
    assert all("cp312" in w or "none-any" in w or "py312" in w for w in wheels), wheels
    assert sum(p.stat().st_size for p in (tmp_path / "whl").glob("*.whl")) <= 60 * 2**20


def test_the_gpu_check_rehearsed_on_cpu_writes_its_files_and_says_it_ran_no_gpu(tmp_path):
    """The script end to end on CPU ranks: the plugin installed from its carried wheel, the one-GPU profile's smoke
    cells as real world-1 cells (a CPU copy), one cell of the 8-GPU profile's trace tier on this CPU (no GPU is
    visible), and at most 8 files out, every one saying CPU where it says where it ran."""
    wheels, out = tmp_path / "whl", tmp_path / "out"
    built = subprocess.run(
        ["python3", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    env = {**os.environ, "CPU_REHEARSAL": "1", "OUT": str(out), "PYTHON": sys.executable, "WHEELS": str(wheels)}
    done = subprocess.run(
        ["bash", str(GPU / "run.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**env, "PART_LIMIT": "900"},
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "log.txt",
        "noise-world1.yaml",
        "runs.tgz",
        "summary.json",
        "trace.json",
        "trace.md",
        "world1.json",
        "world1.md",
    ]
    assert "CPU rehearsal (CPU_REHEARSAL=1): no CUDA" in log and "torchtitan 0.2.2" in log
    summary = json.loads((out / "summary.json").read_text())
    cells = {(c["part"], c["id"]): c for c in summary["cells"]}
    assert sorted(cells) == [
        ("trace", "llama3-dpr2-dp2-tp2-compiled"),
        ("world1", "deepseek_v3-dp1-eager"),
        ("world1", "llama3-dp1-compiled"),
        ("world1", "llama3-dp1-eager"),
    ], summary
    assert all(c["device"] == "cpu" and c["peak_memory_gib"] is None for c in cells.values())  # CPU: no allocator
    for model in ("llama3", "deepseek_v3"):  # real world-1 cells: they trained, and say how fast
        world1 = cells[("world1", f"{model}-dp1-eager")]
        assert world1["status"] == "passed" and world1["last_loss"] < world1["first_loss"] and world1["tokens_per_s"]
        assert world1["tier"] == "real" and world1["triton_kernels"] is None  # (eager: no compile trace)
    # the numerics path: the compiled cell against the eager one, its lane's tolerances said unmeasured here, its
    # noise written (the trace tier's numbers are a simulated rank's: none)
    compiled = cells[("world1", "llama3-dp1-compiled")]
    assert (compiled["vs"], compiled["lane"]) == ("llama3-dp1-eager", "inductor"), compiled
    assert compiled["loss_rel_diff"] == 0 and compiled["tolerances"].startswith("unmeasured on this machine")
    noise = (out / "noise-world1.yaml").read_text()
    assert (
        "profile titan02-h200x1" in noise and "  llama3-dp1-compiled: {loss: " in noise and "torchtitan: 0.2.2" in noise
    )
    assert cells[("trace", "llama3-dpr2-dp2-tp2-compiled")]["lane"] is None
    traced = cells[("trace", "llama3-dpr2-dp2-tp2-compiled")]
    assert (traced["status"], traced["tier"], traced["triton_kernels"]) == ("passed", "trace", 0)  # CPU: C++ kernels
    trace_md = (out / "trace.md").read_text()
    assert "TRACE TIER: each cell ran as ONE simulated rank on a CPU machine" in trace_md and "ONE GPU" not in trace_md
    text = (out / "log.txt").read_text()
    assert "/tmp/gpu-site." in text and "/pytest_simplefsdp/__init__.py" in text  # the carried wheel's plugin ran
    assert "PASSED matrix/titan02-h100x8.yaml[trace]::llama3-dpr2-dp2-tp2-compiled" in text
