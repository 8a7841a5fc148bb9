"""How often ranks crash (killed by a signal) under each launcher, on the same real CPU cells, under load. Not a test.

    python benchmarks/crashes.py [--runs 8] [--load 2] [--cells ID ...] [--launchers fork local torchrun] [--fresh]

Each run is one ``pytest --simplefsdp-matrix matrix/cpu.yaml::<cell> --simplefsdp-launcher=L
--simplefsdp-confirm=1`` in a folder of its launcher (seed checkpoints and baselines kept after the first run;
``--fresh``: made again in every run, as a first run makes them: issue 39's crash was a forked baseline's),
round-robin over the launchers, while ``--load`` processes spin on the CPUs (a CI machine running something else).
A run's first attempt is its record's failure class (a crash is `crash`: a rank killed by a signal); a crashed run
is run once more by the plugin (session.state.confirm), whose outcome is the record's ``confirm``. Prints per
launcher and cell: runs, first attempts that crashed, baselines that crashed, other failures, crashes that passed
when run again, the signals seen, and the runs whose fork server held another thread when it forked.
"""

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIGNAL = re.compile(r"killed by (SIG\w+)")


def spin(stop):
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def one(folder, cell, launcher, fresh=False):
    """(record of the cell, wall seconds) of one plugin run."""
    out = folder / "run.json"
    start = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"matrix/cpu.yaml::{cell}",
            f"--simplefsdp-launcher={launcher}",
            "--simplefsdp-confirm=1",
            f"--simplefsdp-json={out}",
            *(["--simplefsdp-fresh"] if fresh else []),
            "-p",
            "no:cacheprovider",
            "-q",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    doc = json.loads(out.read_text()) if out.is_file() else {"runs": [{"cells": []}]}
    rec = next((c for c in doc["runs"][0]["cells"] if c["id"] == cell), {"status": "missing"})
    return rec, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--cells", nargs="+", default=["deepseek_v3-dp2-ep2-eager", "llama3-dp2-eager"])
    parser.add_argument("--launchers", nargs="+", default=["fork", "local", "torchrun"])
    parser.add_argument("--fresh", action="store_true", help="seed checkpoints and baselines made again every run")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="simplefsdp-crashes-"))
    stop = multiprocessing.Event()
    load = [multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    rows = {}
    try:
        for n in range(args.runs):
            for cell in args.cells:
                for launcher in args.launchers:
                    folder = root / launcher
                    folder.mkdir(exist_ok=True)
                    rec, wall = one(folder, cell, launcher, args.fresh)
                    row = rows.setdefault(
                        (launcher, cell),
                        {
                            "runs": 0,
                            "crashed": 0,
                            "baseline": 0,
                            "other": 0,
                            "passed again": 0,
                            "threads": 0,
                            "signals": Counter(),
                            "walls": [],
                        },
                    )
                    row["runs"] += 1
                    row["walls"].append(wall)
                    row["threads"] += any("other thread" in d for d in rec.get("details") or [])
                    line = rec.get("error_line") or ""
                    if rec.get("failure_class") == "infra" and line.startswith("baseline ") and SIGNAL.search(line):
                        row["baseline"] += 1
                        row["signals"].update(SIGNAL.findall(line))
                    elif rec.get("failure_class") == "crash":
                        row["crashed"] += 1
                        row["signals"].update(SIGNAL.findall(rec.get("error_line") or ""))
                        row["passed again"] += int((rec.get("confirm") or {}).get("passed", 0) > 0)
                    elif rec.get("status") != "passed":
                        row["other"] += 1
                    print(
                        f"run {n + 1}/{args.runs} {launcher:8} {cell}: {rec.get('status')} "
                        f"{rec.get('failure_class') or ''} {wall:.0f}s",
                        flush=True,
                    )
    finally:
        stop.set()
        for p in load:
            p.join()
    print(f"\nload: {args.load} busy processes on {os.cpu_count()} CPUs; folders under {root}")
    print(
        f"{'launcher':9} {'cell':28} {'runs':>4} {'crashed':>7} {'baseline crashed':>16} {'other':>5} "
        f"{'passed again':>12} {'threads':>7}  signals  median wall"
    )
    for (launcher, cell), r in rows.items():
        walls = sorted(r["walls"])
        print(
            f"{launcher:9} {cell:28} {r['runs']:>4} {r['crashed']:>7} {r['baseline']:>16} {r['other']:>5} "
            f"{r['passed again']:>12} {r['threads']:>7}  {dict(r['signals']) or '-'}  {walls[len(walls) // 2]:.0f}s"
        )


if __name__ == "__main__":
    main()
