"""Benchmark: what the per-parameter gradient probe, and all of the plugin's rank-side probes, cost a real CPU cell.
Not a test.

    python benchmarks/grad_probe.py [--repeat 3] [--cells ID ID ...]

Runs each cell once through the plugin (CPU profile with numerics: seed checkpoint, command.txt), then
times the cell's own command round-robin as the plugin runs it, with SIMPLEFSDP_GRAD_PROBE=0, and with every probe
off (no evidence probe, invariants, gradient probe or provenance record: the shim's CPU patches alone, what
torchtitan itself costs on CPU), and prints per-cell medians, the ratios, and the machine's load average.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CELLS = ["llama3-dp2-eager", "deepseek_v3-dp2-ep2-eager"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--simplefsdp-matrix",
                "--simplefsdp-profile=cpu",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--simplefsdp-artifacts={runs}",
                "-k",
                f"({' or '.join(a.cells)}) and not fsdp2 and not spmd_types",
            ],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        print(
            f"{'cell':32} {'as run s':>8} {'grad off s':>10} {'all off s':>9} {'run/grad off':>12} {'run/all off':>11}"
        )
        for cell in a.cells:
            command = (runs / "cpu" / cell / "command.txt").read_text().strip()
            variants = {
                "run": command,
                "grad off": command.replace("SIMPLEFSDP_GRAD_PROBE=1", "SIMPLEFSDP_GRAD_PROBE=0"),
                "all off": re.sub(r"SIMPLEFSDP_(PROBE|INVARIANTS|GRAD_PROBE|PROVES)=\S+ ", "", command),
            }
            times = {k: [] for k in variants}
            for _ in range(a.repeat):
                for name, text in variants.items():
                    start = time.monotonic()
                    subprocess.run(
                        ["bash", "-c", text], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                    times[name].append(time.monotonic() - start)
            m = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{cell:32} {m['run']:8.1f} {m['grad off']:10.1f} {m['all off']:9.1f} "
                f"{m['run'] / m['grad off']:12.2f} {m['run'] / m['all off']:11.2f}"
            )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
