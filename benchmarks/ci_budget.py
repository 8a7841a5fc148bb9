"""Where CI's time goes: runs the README's test command's tox environments as CI does (``--parallel 2``: ``tox p -p 2``,
two at a time in the order given, the command's total wall and each environment's as tox reports it) or one after
another (``--parallel 0``: ``tox -e ENV`` each), their environments built if they are not, with benchmarks/ci_probe.py recording every test (workers too:
tests/conftest.py registers it where $SIMPLEFSDP_CI_BUDGET_OUT is set), and prints the wall per environment and the slowest tests with what each waits on:

- ``real cells``: the test runs real torchtitan cells (tier real or e2e; most of its time is torchtitan's own),
- ``slurm``: jobs through the single-node SLURM,
- ``env build``: a version set's environment, a wheel or the bundle's clone built inside the test,
- ``waiting``: the test and its children used under a third of a core over its wall (timeouts, sleeps, polls),
- ``compute``: the rest (fake ranks, pytester sessions, parsing).

It measures, it asserts nothing. Keep its table in docs/measurements.md ("CI").

    python benchmarks/ci_budget.py [--envs lint,titan03,main,titan02,titan022] [--parallel 2] [--top 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDS = ("version_set", "venv", "wheel", "bundle", "clone", "env")  # fixture names that build something


def waits_on(record) -> str:
    markers, fixtures = set(record["markers"]), record["fixtures"]
    if "slurm" in markers:
        return "slurm"
    if {"real", "e2e"} & markers:
        return "real cells"
    if any(b in f for f in fixtures for b in BUILDS) or any(b in record["test"] for b in ("wheel", "version_set")):
        return "env build"
    if record["wall"] > 1 and record["cpu"] < record["wall"] / 3:
        return "waiting"
    return "compute"


def run_parallel(envs, limit, out, posargs) -> dict:
    """``tox p``: the command's wall as "all", each environment's as tox reports it (setup and commands)."""
    environ = {**os.environ, "SIMPLEFSDP_CI_BUDGET_OUT": str(out / "tests")}
    (out / "tests").mkdir(parents=True)
    args = [sys.executable, "-m", "tox", "p", "-p", str(limit), "--parallel-no-spinner", "-e", ",".join(envs)]
    args += ["--", *posargs] if posargs else []  # (lint's commands take none)
    start = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True)
    (out / "tox.log").write_text(proc.stdout + proc.stderr)
    walls = {"all": (time.monotonic() - start, proc.returncode)}
    for env in envs:  # "  titan03: OK (1228.31=setup[3.10]+cmd[1225.21] seconds)"
        m = re.search(rf"^\s*{re.escape(env)}: (\w+).*?\(([\d.]+)=", proc.stdout, re.M)
        if m:
            walls[env] = (float(m.group(2)), 0 if m.group(1) == "OK" else 1)
    return walls


def run_env(env, out, posargs) -> tuple[float, int]:
    folder = out / env
    folder.mkdir(parents=True)
    environ = {**os.environ, "SIMPLEFSDP_CI_BUDGET_OUT": str(folder)}
    args = [sys.executable, "-m", "tox", "-e", env]
    if env != "lint" and posargs:
        args += ["--", *posargs]
    start = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True)
    (out / f"{env}.log").write_text(proc.stdout + proc.stderr)
    return time.monotonic() - start, proc.returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="lint,titan03,main,titan02,titan022")
    p.add_argument("--parallel", type=int, default=2, help="environments at a time, as CI runs them (0: one by one)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--json", help="write every test's record here")
    p.add_argument("posargs", nargs="*", help="passed to every pytest (after --)")
    a = p.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="ci-budget-"))
    walls, records, envs = {}, [], a.envs.split(",")
    if a.parallel:
        walls = run_parallel(envs, a.parallel, out, a.posargs)
        for f in sorted((out / "tests").glob("*.jsonl")):
            records += [json.loads(line) for line in f.read_text().splitlines()]
        print(f"all ({a.parallel} at a time): {walls['all'][0]:.0f} s (exit {walls['all'][1]})", flush=True)
    for env in envs if not a.parallel else ():
        walls[env] = run_env(env, out, a.posargs)
        for f in sorted((out / env).glob("*.jsonl")):
            records += [{**json.loads(line), "env": env} for line in f.read_text().splitlines()]
        print(f"{env}: {walls[env][0]:.0f} s (exit {walls[env][1]})", flush=True)
    print(f"\nlogs: {out}\n\nenvironment | wall s | tests | test time s | of it waiting s | real cells s")
    print("---|---|---|---|---|---")
    for env, (wall, _) in walls.items():
        if env == "all":
            continue
        mine = [r for r in records if r["env"] == env]
        kinds = {k: sum(r["wall"] for r in mine if waits_on(r) == k) for k in ("waiting", "real cells")}
        print(
            f"{env} | {wall:.0f} | {len(mine)} | {sum(r['wall'] for r in mine):.0f} | {kinds['waiting']:.0f} | "
            f"{kinds['real cells']:.0f}"
        )
    total = walls["all"][0] if "all" in walls else sum(w for w, _ in walls.values())
    print(f"all | {total:.0f} | {len(records)} | | |")
    print(f"\nthe {a.top} slowest tests\n\nwall s | cpu s | waits on | environment | test")
    print("---|---|---|---|---")
    for r in sorted(records, key=lambda r: -r["wall"])[: a.top]:
        print(f"{r['wall']:.0f} | {r['cpu']:.0f} | {waits_on(r)} | {r['env']} | {r['test']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"walls": walls, "tests": records}, indent=1))


if __name__ == "__main__":
    main()
