"""Whether a CPU cell's bits depend on the machine: a cell of a stored run (its folder's command.txt, the local
launcher's form) run again on other CPUs, emulated by qemu's user mode (Debian's qemu-user: `qemu-x86_64 -cpu
Haswell`, an AVX2 Intel; `-cpu EPYC-Rome`, an AVX2 AMD), or with what picks the CPU kernels set otherwise
(ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA: another CPU's dispatch on this one), and compared bit for
bit with the stored run: its losses (TensorBoard), every parameter's gradient norm and norm after the step, and
every update norm. Prints one row per variant.

    python benchmarks/numerics_machines.py .simplefsdp/runs/<run>/cpu/<cell> --cpu native --cpu Haswell \\
        --cpu EPYC-Rome [--numerics none ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16,MKL_CBWR=AVX512] [--out DIR]

It measures, it asserts nothing; qemu is slow (tens of times), so give it one or two cells of a few minutes."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_simplefsdp.run.baselines import param_stats  # noqa: E402
from pytest_simplefsdp.shim.provenance import NUMERICS_ENV  # noqa: E402
from pytest_simplefsdp.targets.base import tensorboard_losses  # noqa: E402

PINS = [k for k in NUMERICS_ENV if k != "OMP_NUM_THREADS"]
PYTHON = re.compile(r"(?<= )(\S+/python[\d.]*)(?= -m )")


def pins_of(numerics: str) -> dict:
    """Pins written out (``ATEN_CPU_CAPABILITY=avx2,MKL_CBWR=AVX2``; ``none``: no pins)."""
    return dict(pin.split("=", 1) for pin in numerics.split(",") if "=" in pin)


def variant_line(line: str, cell: Path, out: Path, cpu: str, numerics: str) -> str:
    """The stored command with the cell's folder moved to ``out``, the pins of ``numerics`` in every rank's
    environment (and no other), a fresh port, and every rank's Python under qemu for an emulated ``cpu``."""
    line = line.replace(str(cell), str(out))
    line = re.sub(r"(?<= )(%s)=\S+ " % "|".join(PINS), "", line)
    pins = " ".join(f"{k}={v}" for k, v in pins_of(numerics).items())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = re.sub(r"MASTER_PORT=\d+", f"MASTER_PORT={port}" + (f" {pins}" if pins else ""), line)
    if cpu != "native":
        line = PYTHON.sub(lambda m: f"qemu-x86_64 -cpu {shlex.quote(cpu)} {m.group(1)}", line)
    return line


def compare(a: dict, b: dict) -> tuple[int, float]:
    """(values compared, largest relative difference) of two nested {..: number} records."""
    n, worst = 0, 0.0
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        if isinstance(x, dict) and isinstance(y, dict):
            m, w = compare(x, y)
            n, worst = n + m, max(worst, w)
        elif isinstance(x, (int, float)) and isinstance(y, (int, float)):
            n += 1
            if x != y:
                worst = max(worst, abs(x - y) / abs(x) if x else math.inf)
    return n, worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cells", nargs="+", type=Path, help="cell folders of a stored run (each with its command.txt)")
    p.add_argument("--cpu", action="append", default=[], help="native, or a qemu CPU model (qemu-x86_64 -cpu help)")
    p.add_argument(
        "--numerics",
        nargs="+",
        default=["none"],
        help="none, or pins written out: ATEN_CPU_CAPABILITY=avx2,MKL_CBWR=AVX2",
    )
    p.add_argument("--out", type=Path, default=Path("numerics-machines"))
    p.add_argument("--timeout", type=float, default=7200.0)
    a = p.parse_args(argv)
    rows = []
    for cell in a.cells:
        line = (cell / "command.txt").read_text().strip()
        ref_losses, ref_stats = tensorboard_losses(cell / "dump"), param_stats(cell)
        for numerics in a.numerics:
            for cpu in a.cpu or ["native"]:
                out = (a.out / re.sub(r"[^\w.-]+", "_", f"{cell.name}-{cpu}-{numerics}")).resolve()
                out.mkdir(parents=True, exist_ok=True)
                start = time.monotonic()
                proc = subprocess.run(
                    ["bash", "-c", variant_line(line, cell.resolve(), out, cpu, numerics)],
                    capture_output=True,
                    text=True,
                    timeout=a.timeout,
                )
                wall = time.monotonic() - start
                (out / "variant.log").write_text(proc.stdout + proc.stderr)
                losses, stats = tensorboard_losses(out / "dump"), param_stats(out)
                machine = (
                    json.loads((out / "evidence" / "rank0.json").read_text()).get("machine", {})
                    if (out / "evidence" / "rank0.json").is_file()
                    else {}
                )
                nl, wl = compare({str(k): v for k, v in ref_losses.items()}, {str(k): v for k, v in losses.items()})
                ns, ws = compare(ref_stats, stats)
                rows.append(
                    (
                        cell.name,
                        cpu,
                        numerics,
                        machine.get("aten"),
                        f"{wall:.0f}",
                        len(losses),
                        "equal" if nl and not wl else f"{wl:.2e}",
                        ns,
                        "equal" if ns and not ws else f"{ws:.2e}",
                    )
                )
                print(*rows[-1], sep="  ", flush=True)
    print("\ncell  cpu  numerics  aten  wall_s  steps  losses_vs_stored  params_compared  params_vs_stored")
    for row in rows:
        print(*row, sep="  ")


if __name__ == "__main__":
    main()
