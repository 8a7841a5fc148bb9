"""Progress while a matrix runs: each cell's expected time (from the newest stored run of the same profile,
else a stated estimate per cell size), and after each cell how far the run is and when it should end."""

from __future__ import annotations

import json
import time
from pathlib import Path

# seconds a CPU cell of N ranks takes when no stored run says better: the medians of the CPU profile's cells
# of 2, 4 and 8 ranks on 2 cores (gloo, 3 steps; benchmarks/launchers.py profile), forked and as torchrun jobs
# (local and slurm start ranks as torchrun does). More cores make it an over-estimate until a run is stored.
CPU_MEDIANS = {"fork": {2: 12.0, 4: 22.0, 8: 109.0}, "torchrun": {2: 24.0, 4: 42.0, 8: 158.0}}
GPU_CELL = 60.0  # an 8-GPU debug cell on a GPU host


def estimate(device: str, launcher: str, world: int) -> float:
    """A cell's expected seconds: linear between the measured sizes, the nearest one outside them."""
    if device != "cpu":
        return GPU_CELL
    table = CPU_MEDIANS["fork" if launcher == "fork" else "torchrun"]
    sizes = sorted(table)
    if world <= sizes[0] or world >= sizes[-1]:
        return table[sizes[0] if world <= sizes[0] else sizes[-1]]
    lo = max(n for n in sizes if n <= world)
    hi = min(n for n in sizes if n >= world)
    return table[lo] if lo == hi else table[lo] + (table[hi] - table[lo]) * (world - lo) / (hi - lo)


def stored_walls(runs_dirs, profiles: set, newest=20) -> dict:
    """{(profile[tier]::cell id, launcher): (wall seconds, run folder)} from the newest stored runs
    (results.jsonl) under any of ``runs_dirs`` that ran cells of these profiles (the newest first; an older run
    fills cells the newer one did not run; the dict keeps that order). Keyed by the launcher that ran the cell: a torchrun job takes about
    twice a forked cell's time, so one launcher's times are no forecast for another's."""
    walls = {}
    found = {p for d in runs_dirs for p in Path(d).glob("*/results.jsonl")}
    files = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:newest]
    for path in files:
        metas = {}
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
            if rec.get("type") == "meta":
                metas[rec.get("matrix")] = rec
            elif rec.get("type", "cell") == "cell" and rec.get("wall") and not rec.get("mutant"):
                meta = metas.get(rec.get("matrix"), {})
                if meta.get("profile") in profiles:
                    tier = "[trace]" if meta.get("tier") == "trace" else ""
                    key = (f"{meta['profile']}{tier}::{rec['id']}", rec.get("launcher") or meta.get("launcher"))
                    walls.setdefault(key, (float(rec["wall"]), str(path.parent)))
    return walls


class Progress:
    """The run's cells in order with their expected seconds; ``finished`` takes what a cell really took."""

    def __init__(self, expected: dict, jobs: int = 1, source: str | None = None, stored=frozenset()):
        self.expected = dict(expected)  # key -> expected seconds, for every selected cell
        self.stored = set(stored)  # the keys whose time a stored run gave (the others are estimates)
        self.jobs = max(1, jobs)
        self.source = source
        self.done = {}  # key -> real seconds
        self.start = time.monotonic()

    def finished(self, key, wall):
        self.done[key] = wall

    def eta(self):
        """Seconds left: what the remaining cells are expected to take, scaled by how the finished cells
        compared with their own expectation (a loaded machine runs everything slower)."""
        left = sum(v for k, v in self.expected.items() if k not in self.done)
        planned = sum(self.expected.get(k, 0) for k in self.done)
        pace = (sum(self.done.values()) / planned) if planned > 0 and self.done else 1.0
        return left * pace / self.jobs

    def line(self):
        return (
            f"{len(self.done)}/{len(self.expected)} cells, {duration(time.monotonic() - self.start)} elapsed, "
            f"ETA {duration(self.eta())}"
        )


def duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
