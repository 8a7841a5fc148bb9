"""Benchmark of the launchers and of the CPU main job, measured side by side in one run. Not a test.

    python benchmarks/launchers.py cells [--repeat 3] [--cells ID ...] [--launchers torchrun local fork]
    python benchmarks/launchers.py profile

``cells``: the same real CPU cells (the CPU profile without numerics: one launch per cell) as (a) the bare
``torchrun`` command a user would type, timed from outside, and through the plugin with each launcher,
round-robin, ``--repeat`` times. Prints per-cell medians, the whole-run totals, ratios bare / launcher, the
machine's load before and after, and whether every launcher gave bitwise the same losses and grad norms as
bare torchrun on every cell. Goals (issue 20): the default CPU launcher (auto = fork) at least 4x bare
torchrun per eager cell and 3x per aot_fx_trace cell (medians of 3).

``profile``: the whole CPU profile (``matrix/cpu.yaml``, numerics and all) three times in a row:
``--simplefsdp-launcher=torchrun --simplefsdp-fresh`` (the main job as it ran before the fork default and the
kept seeds and baselines), the default cold (``--simplefsdp-fresh``) and the default warm (seed checkpoints
and baselines kept by the cold run). Prints the per-cell times of each and the totals, and torchtitan's own
time in the warm run's jobs (from its log's timestamps): the floor no launcher goes below. Goal: warm at
most half of the first.

A plugin cell's time is its record's wall (from its launch to its last rank's exit); the fork server's start
is paid once per run and shows in the totals, not in the cells.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_simplefsdp.judge.results import cell_losses, read_text  # noqa: E402
from pytest_simplefsdp.launch.procs import free_port  # noqa: E402
from pytest_simplefsdp.launch.spec import LaunchSpec  # noqa: E402
from pytest_simplefsdp.launch.torchrun import TorchrunLauncher  # noqa: E402
from pytest_simplefsdp.spec.cells import expand  # noqa: E402
from pytest_simplefsdp.spec.matrix import load_matrix  # noqa: E402
from pytest_simplefsdp.targets import make_target  # noqa: E402

DEFAULT_CELLS = [
    "llama3-dp2-eager",
    "llama3-tp2-eager",
    "deepseek_v3-dp2-ep2-eager",
    "llama3-dp2-aot_fx_trace-mp_default",
    "deepseek_v3-dp2-ep2-aot_fx_trace-mp_default",
]


TITAN_LINE = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)")
STEP = re.compile(r"step:\s*\d+\s+loss")


def titan_times(text):
    """(work, steps) in seconds from torchtitan's own timestamps in a rank's log: work from its first line (after
    the imports) to its last step line, steps from "Training starts" to that line: what the cell exists for,
    which no launcher can shorten. Either is None when the log has no steps."""
    first = start = last = None
    for stamp, what in TITAN_LINE.findall(text):
        t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
        first = t if first is None else first
        if "Training starts" in what:
            start = t if start is None else start
        elif start is not None and STEP.search(what):
            last = t
    if start is None or last is None:
        return None, None
    return last - first, last - start


def steps_time(text):
    return titan_times(text)[1]


def load():
    return f"{os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"


def plain_matrix(tmp):
    """The CPU profile without numerics (no seed checkpoints or baselines: one run per cell)."""
    yaml = YAML(typ="rt")
    doc = yaml.load((ROOT / "matrix" / "cpu.yaml").read_text())
    for key in ("numerics", "groups"):
        doc.pop(key, None)
    path = Path(tmp) / "cpu.yaml"
    with open(path, "w") as f:
        yaml.dump(doc, f)
    return path


def bare(matrix_path, ids, work):
    """The torchrun command a user would type, per cell, timed from outside: {id: (wall, losses, grad norms)}."""
    matrix = load_matrix(matrix_path)
    target = make_target(matrix, ROOT / ".simplefsdp")
    target.prepare()
    cells = {c.id: c for c in expand(matrix)[0]}
    out = {}
    for cid in ids:
        cell, folder = cells[cid], Path(work) / "bare" / cid
        folder.mkdir(parents=True, exist_ok=True)
        spec = LaunchSpec(cid, target.command(cell, dump_folder=folder / "dump"), cell.world, folder, 900, free_port())
        argv = [a for a in TorchrunLauncher().torchrun_argv(spec) if not a.startswith(("--log-dir", "--redirects"))]
        env = dict(os.environ, **spec.command.env)
        start = time.monotonic()
        with open(folder / "out.log", "wb") as f:
            subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
        wall = time.monotonic() - start
        text = read_text([folder / "out.log"])
        losses, norms = cell_losses({0: text})
        out[cid] = (wall, losses, norms, steps_time(text))
    return out


def pytest_run(args, js, artifacts):
    """One pytest --simplefsdp-matrix run: (its wall, {id: record} of its cells and numerics baselines)."""
    start = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-json={js}",
            "-q",
            f"--simplefsdp-artifacts={artifacts}",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    total = time.monotonic() - start
    doc = json.loads(Path(js).read_text())["runs"][0]
    return total, {c["id"]: c for c in doc["cells"] + doc.get("baselines", [])}


def cells_mode(args):
    print(f"load average before: {load()}; cores: {os.cpu_count()}")
    kinds = ["bare", *args.launchers]
    walls = {k: {cid: [] for cid in args.cells} for k in kinds}
    # the training steps inside each wall: the plugin's from rank 0's log; bare torchrun's from its console, where
    # every rank's lines are mixed (first "Training starts" to the last step line of any rank)
    steps = {k: {cid: [] for cid in args.cells} for k in kinds}
    totals = {k: [] for k in kinds}
    same, verdicts = True, []
    expr = " or ".join(args.cells)
    with tempfile.TemporaryDirectory() as tmp:
        matrix = plain_matrix(tmp)
        for i in range(args.repeat):
            work = Path(tmp) / f"r{i}"
            ref = bare(matrix, args.cells, work)
            for cid, (wall, _, _, spent) in ref.items():
                walls["bare"][cid].append(wall)
                steps["bare"][cid].append(spent)
            totals["bare"].append(sum(r[0] for r in ref.values()))
            for launcher in args.launchers:
                total, recs = pytest_run(
                    [
                        f"--simplefsdp-matrix-file={matrix}",
                        f"--simplefsdp-launcher={launcher}",
                        "-k",
                        f"({expr}) and not fsdp2 and not spmd_types",
                    ],  # ids: substrings of twins'
                    work / f"{launcher}.json",
                    work / launcher,
                )
                totals[launcher].append(total)
                for cid in args.cells:
                    rec = recs[cid]
                    walls[launcher][cid].append(rec["wall"])
                    steps[launcher][cid].append(steps_time(read_text(rec["rank_logs"].get("0", []))))
                    _, losses, norms, _ = ref[cid]
                    got = tuple({int(k): v for k, v in rec[key].items()} for key in ("losses", "grad_norms"))
                    if got != (losses, norms) or not losses:
                        same = False
                        print(f"  run {i + 1}: {cid}: {launcher} losses/grad norms differ from bare torchrun")
                    if rec["status"] != "passed":
                        verdicts.append(f"run {i + 1}: {cid}: {launcher} {rec['status']} {rec.get('error_line')}")
                    if launcher == "auto" and rec["launcher"] != "fork":
                        verdicts.append(f"run {i + 1}: {cid}: auto ran {rec['launcher']}, not fork")
            print(
                f"run {i + 1}/{args.repeat}: "
                + ", ".join(f"{k} {totals[k][-1]:.1f} s" for k in kinds)
                + f"; load {load()}"
            )
    med = {k: {cid: statistics.median(v) for cid, v in walls[k].items()} for k in kinds}
    print(
        f"\nmedians over {args.repeat} runs, seconds (bare: the torchrun command alone; the others: the plugin "
        f"with that launcher, the cell's record wall)"
    )
    head = f"{'cell':46}" + "".join(f"{k:>9}" for k in kinds) + "".join(f"{'bare/' + k:>14}" for k in args.launchers)
    print(head)
    for cid in args.cells:
        print(
            f"{cid:46}"
            + "".join(f"{med[k][cid]:9.1f}" for k in kinds)
            + "".join(f"{med['bare'][cid] / med[k][cid]:14.2f}" for k in args.launchers)
        )
    tot = {k: statistics.median(totals[k]) for k in kinds}
    print(
        f"{'total (plugin: the whole pytest run)':46}"
        + "".join(f"{tot[k]:9.1f}" for k in kinds)
        + "".join(f"{tot['bare'] / tot[k]:14.2f}" for k in args.launchers)
    )
    # what is left of a cell when start-up is gone: its training steps. bare / steps is the most any launcher
    # could reach on that cell without changing the work it runs
    print(
        f"\ntraining steps (\"Training starts\" to the last step line: rank 0's log under the plugin, every rank's "
        f"lines in bare torchrun's console), medians, seconds; bare/steps: bare torchrun's wall over the steps "
        f"under {kinds[-1]}, the most any launcher could reach"
    )
    print(f"{'cell':46}" + "".join(f"{k:>9}" for k in kinds) + f"{'bare/steps':>14}")
    for cid in args.cells:
        med_steps = {k: statistics.median([x for x in steps[k][cid] if x is not None] or [float("nan")]) for k in kinds}
        print(
            f"{cid:46}"
            + "".join(f"{med_steps[k]:9.1f}" for k in kinds)
            + f"{med['bare'][cid] / med_steps[kinds[-1]]:14.2f}"
        )
    print(f"losses and grad norms bitwise identical to bare torchrun, every launcher, every cell, every run: {same}")
    print("verdicts: " + ("every cell passed under every launcher" if not verdicts else "; ".join(verdicts)))
    print(f"load average after: {load()}")


def profile_mode(args):
    runs = [
        ("torchrun, fresh", ["--simplefsdp-launcher=torchrun", "--simplefsdp-fresh"]),
        ("default, cold", ["--simplefsdp-fresh"]),
        ("default, warm", []),
    ]
    select = ["-k", args.select] if args.select else []
    print(f"load average before: {load()}; cores: {os.cpu_count()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(runs):
            total, recs = pytest_run(extra + select, Path(tmp) / f"{i}.json", Path(tmp) / f"run{i}")
            # torchtitan's own time in each job this run launched (rank 0's log): a kept job ran in an earlier run
            times = {
                cid: (None, None) if r.get("reused_from") else titan_times(read_text(r["rank_logs"].get("0", [])))
                for cid, r in recs.items()
            }
            results.append((name, total, recs, times))
            used = sorted({r["launcher"] for r in recs.values()})
            print(f"{name}: {total:.0f} s ({len(recs)} cells; launchers {used}); load {load()}")
    ids = list(results[0][2])
    last_name, _, _, last_times = results[-1]
    print(
        f'\nper cell, seconds: each run\'s record wall ("kept": reused from an earlier run, not run; the status '
        f"where not passed), then torchtitan's own time in the {last_name} run, from rank 0's log: its work (first "
        f"line after the imports to the last step) and the training steps in it"
    )
    print(f"{'cell':58}" + "".join(f"{name:>17}" for name, *_ in results) + f"{'titan work':>12}{'steps':>8}")
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    for cid in ids:
        row = []
        for _, _, recs, _ in results:
            rec = recs.get(cid)
            status = "" if rec is None or rec["status"] == "passed" else f" {rec['status']}"
            row.append("-" if rec is None else "kept" if rec.get("reused_from") else f"{rec['wall']:.1f}{status}")
        work, steps = last_times.get(cid, (None, None))
        print(f"{cid:58}" + "".join(f"{r:>17}" for r in row) + f"{fmt(work):>12}{fmt(steps):>8}")
    base = results[0][1]
    work = sum(w for w, _ in last_times.values() if w is not None)
    steps = sum(s for _, s in last_times.values() if s is not None)
    print(
        f"{'jobs run (and kept from an earlier run)':58}"
        + "".join(
            f"{sum(1 for r in recs.values() if not r.get('reused_from')):>11} ({sum(1 for r in recs.values() if r.get('reused_from'))})"
            for _, _, recs, _ in results
        )
    )
    print(
        f"{'total (the whole pytest run)':58}"
        + "".join(f"{total:17.0f}" for _, total, *_ in results)
        + f"{work:12.0f}{steps:8.0f}"
    )
    print(
        f"{'ratio to the first':58}"
        + "".join(f"{total / base:17.2f}" for _, total, *_ in results)
        + f"{work / base:12.2f}{steps / base:8.2f}"
    )
    print(
        f"floor: torchtitan's own work in the {last_name} run is {work / base:.2f} of the first run's wall "
        f"({steps / base:.2f} in training steps): one cell at a time, no launcher goes below it"
    )
    print(f"load average after: {load()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    cells = sub.add_parser("cells", help="bare torchrun against the plugin's launchers, per cell")
    cells.add_argument("--repeat", type=int, default=3)
    cells.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    cells.add_argument("--launchers", nargs="+", default=["torchrun", "local", "auto"])
    profile = sub.add_parser("profile", help="the whole CPU profile: torchrun fresh, default cold, default warm")
    profile.add_argument("--select", metavar="EXPR", help="only the cells pytest -k EXPR selects (default: all)")
    args = ap.parse_args()
    (cells_mode if args.mode == "cells" else profile_mode)(args)


if __name__ == "__main__":
    main()
