"""Where CI's time goes: runs the README's test command's tox environments one after another (``tox -e ENV`` each,
its environment built if it is not), timing each, with benchmarks/ci_probe.py recording every test (workers too:
tests/conftest.py registers it where $SIMPLEFSDP_CI_BUDGET_OUT is set), and prints the wall per environment and the slowest tests with what each waits on:

- ``real cells``: the test runs real torchtitan cells (tier real or e2e; most of its time is torchtitan's own),
- ``slurm``: jobs through the single-node SLURM,
- ``env build``: a version set's environment, a wheel or the bundle's clone built inside the test,
- ``waiting``: the test and its children used under a third of a core over its wall (timeouts, sleeps, polls),
- ``compute``: the rest (fake ranks, pytester sessions, parsing).

It measures, it asserts nothing. Keep its table in docs/measurements.md ("CI").

    python benchmarks/ci_budget.py [--envs lint,titan03,titan02,titan022,main] [--top 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
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
    p.add_argument("--envs", default="lint,titan03,titan02,titan022,main")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--json", help="write every test's record here")
    p.add_argument("posargs", nargs="*", help="passed to every pytest (after --)")
    a = p.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="ci-budget-"))
    walls, records = {}, []
    for env in a.envs.split(","):
        walls[env] = run_env(env, out, a.posargs)
        for f in sorted((out / env).glob("*.jsonl")):
            records += [{**json.loads(line), "env": env} for line in f.read_text().splitlines()]
        print(f"{env}: {walls[env][0]:.0f} s (exit {walls[env][1]})", flush=True)
    print(f"\nlogs: {out}\n\nenvironment | wall s | tests | test time s | of it waiting s | real cells s")
    print("---|---|---|---|---|---")
    for env, (wall, _) in walls.items():
        mine = [r for r in records if r["env"] == env]
        kinds = {k: sum(r["wall"] for r in mine if waits_on(r) == k) for k in ("waiting", "real cells")}
        print(
            f"{env} | {wall:.0f} | {len(mine)} | {sum(r['wall'] for r in mine):.0f} | {kinds['waiting']:.0f} | "
            f"{kinds['real cells']:.0f}"
        )
    print(f"all | {sum(w for w, _ in walls.values()):.0f} | {len(records)} | | |")
    print(f"\nthe {a.top} slowest tests\n\nwall s | cpu s | waits on | environment | test")
    print("---|---|---|---|---")
    for r in sorted(records, key=lambda r: -r["wall"])[: a.top]:
        print(f"{r['wall']:.0f} | {r['cpu']:.0f} | {waits_on(r)} | {r['env']} | {r['test']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"walls": walls, "tests": records}, indent=1))


if __name__ == "__main__":
    main()
