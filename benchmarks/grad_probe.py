"""Benchmark: what the per-parameter gradient probe costs a real CPU cell. Not a test.

    python benchmarks/grad_probe.py [--repeat 3] [--cells ID ID ...]

Runs each cell once through the plugin (CPU profile with numerics: seed checkpoint, command.txt), then
times the cell's own command alternately with SIMPLEFSDP_GRAD_PROBE=1 and =0, and prints per-cell
medians, the ratio, and the machine's load average.
"""

import argparse
import os
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
        print(f"{'cell':32} {'probe on s':>10} {'probe off s':>11} {'ratio':>6}")
        for cell in a.cells:
            command = (runs / "cpu" / cell / "command.txt").read_text().strip()
            times = {"1": [], "0": []}
            for _ in range(a.repeat):
                for probe in ("1", "0"):
                    start = time.monotonic()
                    subprocess.run(
                        ["bash", "-c", command.replace("SIMPLEFSDP_GRAD_PROBE=1", f"SIMPLEFSDP_GRAD_PROBE={probe}")],
                        check=True,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    times[probe].append(time.monotonic() - start)
            on, off = statistics.median(times["1"]), statistics.median(times["0"])
            print(f"{cell:32} {on:10.1f} {off:11.1f} {on / off:6.2f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
