"""Where a matrix run's minutes go, from what it left on disk (no rerun): per cell, the launch to torchtitan's first
log line (process start and imports; a forked rank inherits the fork server's), to "Training starts" (model init, the
seed checkpoint's load), to step 1 (the first step: compile, where the cell compiles), to the last step (the other
steps), to torchtitan's last line (its teardown), and to the cell's record (the ranks' exit, probes read, evidence,
invariants and numerics judged: ours). Seed checkpoints and baselines are timed the same way, apart; what is left of
the session's wall (collection, environment checks, waits between cells, reports) is the harness's. It reads
timestamps; it asserts nothing.

    python benchmarks/main_job_breakdown.py RUN_FOLDER [RUN_FOLDER ...]   # .simplefsdp/runs/<time>
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

STAMP = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
PHASES = ("start+imports", "init+seed load", "step 1 (compile)", "other steps", "teardown", "ours after")


def stamp(line):
    m = STAMP.search(line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def phases(folder: Path) -> dict | None:
    """The phases of one job folder (a cell, a baseline), from rank 0's log and the files' times."""
    log, command, result = folder / "rank0.log", folder / "command.txt", folder / "result.json"
    if not (log.is_file() and command.is_file()):
        return None
    lines = [(stamp(x), x) for x in log.read_text(errors="replace").splitlines()]
    lines = [(t, x) for t, x in lines if t is not None]
    if not lines:
        return None
    starts = next((t for t, x in lines if "Training starts" in x), None)
    steps = [t for t, x in lines if re.search(r"step:\s+\d+\s+loss", x)]
    launch, first, last = command.stat().st_mtime, lines[0][0], lines[-1][0]
    end = result.stat().st_mtime if result.is_file() else last
    if starts is None or not steps:
        return None
    got = dict(
        zip(
            PHASES,
            (first - launch, starts - first, steps[0] - starts, steps[-1] - steps[0], last - steps[-1], end - last),
        )
    )
    got["span"] = (launch, last, end)  # (not a phase: what nested jobs are taken out of)
    return got


def nested(cells, jobs):
    """A baseline job runs when the first cell compared with it needs it: after that cell's ranks, before its record.
    Its wall is taken out of that cell's "ours after" (it is counted once, as a baseline)."""
    for _, got in cells:
        _, last, end = got["span"]
        inside = sum(j["span"][2] - j["span"][0] for _, j in jobs if last <= j["span"][0] and j["span"][2] <= end)
        got["ours after"] = max(0.0, got["ours after"] - inside)


def seed_walls(run: Path) -> list:
    """The seed jobs this run made (kept under .simplefsdp/reuse beside the runs): rank 0's first to last line."""
    out = []
    for log in sorted((run.parent.parent / "reuse").glob("seed-*/rank0.log")):
        times = [t for t in map(stamp, log.read_text(errors="replace").splitlines()) if t is not None]
        if times:
            out.append((log.parent.name, max(times) - min(times)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    a = p.parse_args(argv)
    for run in a.runs:
        records = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
        cells = [r for r in records if r.get("type") == "cell"]
        times = [f.stat().st_mtime for f in run.rglob("*")]
        session = max(times) - min(times) if times else 0.0
        rows, other = [], []
        for folder in sorted(p for p in run.glob("*/*") if p.is_dir()):
            got = phases(folder)
            if got is None:
                continue
            (rows if not folder.name.startswith(("baseline-", "seed-")) else other).append((folder.name, got))
        nested(rows, other)
        print(
            f"{run}: {len(cells)} cells recorded, {len(rows)} with a full log, {len(other)} baselines; "
            f"session span {session:.0f} s"
        )
        print("\njob | " + " | ".join(PHASES) + " | all")
        print("---|" + "---|" * (len(PHASES) + 1))
        for name, got in rows + other:
            print(f"{name} | " + " | ".join(f"{got[k]:.1f}" for k in PHASES) + f" | {sum(got[k] for k in PHASES):.1f}")
        for label, group in (("cells", rows), ("baselines", other)):
            if group:
                sums = {k: sum(g[k] for _, g in group) for k in PHASES}
                total = sum(sums.values())
                print(
                    f"\n{label} in total: {total:.0f} s; "
                    + ", ".join(f"{k} {v:.0f} s ({100 * v / total:.0f} %)" for k, v in sums.items())
                )
                print(
                    f"{label}, median per job: "
                    + ", ".join(f"{k} {statistics.median(g[k] for _, g in group):.1f} s" for k in PHASES)
                )
        seeds = seed_walls(run)
        if seeds:
            print("\nseed checkpoints made (rank 0's log): " + ", ".join(f"{n} {w:.1f} s" for n, w in seeds))
        busy = sum(sum(g[k] for k in PHASES) for _, g in rows + other) + sum(w for _, w in seeds)
        print(
            f"\njobs' wall summed (cells, baselines, seeds): {busy:.0f} s against a session span of {session:.0f} s "
            f"(the rest, {max(0.0, session - busy):.0f} s, is the harness's: collection, checks, between jobs, "
            "reports; jobs run side by side under --simplefsdp-jobs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
