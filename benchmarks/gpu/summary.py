"""The GPU check's summary (benchmarks/gpu/run.sh, step 5): per cell of the plugin's JSON files, its part, outcome,
the device its ranks ran on, first and last loss, from its first rank's log the peak memory torchtitan reported
(CUDA's caching allocator on a GPU; nothing on CPU, where it prints -0.00GiB) and the median tokens per second, and
the Triton kernels inductor generated (``@triton.jit`` in the cell's compile trace; 0 on CPU, where inductor writes
C++; None for a cell without a compile trace), and a compared cell's numerics against its baseline.

    python benchmarks/gpu/summary.py world1.json trace.json > summary.json

A JSON file that is missing (a part that did not get as far) is listed under ``missing``, not an error."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

STEP = re.compile(r"step:\s*(\d+)\s.*?memory:\s*(-?[\d.]+)GiB.*?tps:\s*([\d,]+)")


def from_log(paths) -> dict:
    """Peak memory (GiB, the largest a step reported) and median tokens/s of the first rank's log."""
    try:
        steps = [m.groups() for m in STEP.finditer(Path(paths[0]).read_text(errors="replace"))] if paths else []
    except OSError:
        steps = []
    if not steps:
        return {"peak_memory_gib": None, "tokens_per_s": None, "steps_logged": 0}
    peak = max(float(m) for _, m, _ in steps)
    return {
        "peak_memory_gib": peak if peak > 0 else None,
        "tokens_per_s": statistics.median(int(t.replace(",", "")) for *_, t in steps),
        "steps_logged": len(steps),
    }


def triton_kernels(log_dir) -> int | None:
    """How many Triton kernels inductor generated for the cell: ``@triton.jit`` in its compile trace (TORCH_TRACE)."""
    trace = Path(log_dir or "") / "torch_trace"
    if not log_dir or not trace.is_dir():
        return None
    return sum(p.read_text(errors="replace").count("@triton.jit") for p in trace.rglob("*") if p.is_file())


def numerics(rep) -> dict:
    """A compared cell's lane, largest relative loss and step-1 gradient-norm differences from its baseline, and why
    its lane judged it (unmeasured on this GPU); all None for a cell not compared (a baseline, the trace tier)."""
    rep = rep or {}
    params = rep.get("params") if isinstance(rep.get("params"), dict) else {}
    grads = (params.get("max_rel_diff") or {}).get("grad_norm") or {}
    return {
        "lane": rep.get("lane"),
        "vs": rep.get("baseline"),
        "loss_rel_diff": rep.get("max_rel_diff"),
        "grad_rel_diff_step1": grads.get("1"),
        "tolerances": rep.get("noise"),
    }


def cells(path: Path, part: str) -> list[dict]:
    out = []
    for run in json.loads(path.read_text())["runs"]:
        meta = run["meta"]
        for cell in run["cells"]:
            losses = cell.get("losses") or {}
            steps = sorted(losses, key=int)
            logs = (cell.get("rank_logs") or {}).values()
            out.append(
                {
                    "part": part,
                    "profile": meta.get("profile"),
                    "tier": meta.get("tier"),
                    "device": meta.get("device"),
                    "id": cell["id"],
                    "status": cell["status"],
                    "known_failure": cell.get("known_failure"),
                    "error_line": cell.get("error_line"),
                    "first_loss": losses[steps[0]] if steps else None,
                    "last_loss": losses[steps[-1]] if steps else None,
                    "wall": cell.get("wall"),
                    "triton_kernels": triton_kernels(cell.get("log_dir")),
                    **numerics(cell.get("numerics")),
                    **from_log(next(iter(logs), [])),
                }
            )
    return out


def main(argv) -> int:
    found, missing = [], []
    for name in argv:
        path = Path(name)
        if path.is_file():
            found += cells(path, path.stem)
        else:
            missing.append(str(path))
    json.dump({"cells": found, "missing": missing}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
