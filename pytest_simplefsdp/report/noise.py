"""Each layout's noise, measured from a stored run of a whole profile (the report tool's ``--format noise``): per
cell that passed its numerics, the largest relative difference from its baseline of its losses, of its per-parameter
gradient norms on the steps its lane judges them (step 1 for most lanes: the same weights and batch on both sides),
and of its update norms on every step. The numerics section's ``noise`` file holds it; each cell's tolerance is then
``margin`` times its own layout's noise (judge.numerics.narrowed)."""

from __future__ import annotations

import json

from ..judge.numerics import numerics_key
from ..kinds import Status
from ..spec.matrix import NOISE_KINDS
from ..words import release

MARGIN, FLOOR = 5.0, 1.0e-6  # a bug moving a norm by 10x its layout's noise fails; bitwise layouts get the floor


def measure(run) -> dict:
    """cell id -> {kind: largest relative difference} of one stored matrix run's cells that passed their numerics."""
    out = {}
    for rec in run["cells"]:
        n = rec.get("numerics")
        if rec.get("status") != Status.PASSED or not n or rec["axes"].get("versions", "installed") != "installed":
            continue
        row = {"loss": float(n.get("max_rel_diff") or 0.0)}
        params = n.get("params")
        if isinstance(params, dict):
            worst = params.get("max_rel_diff", {})
            grads = worst.get("grad_norm", {})
            row["grad_norm"] = max((v for s, v in grads.items() if int(s) <= params.get("grad_steps", 1)), default=0.0)
            row["update_norm"] = max(worst.get("update_norm", {}).values(), default=0.0)
        out[rec["id"]] = row
    return out


def machine_of(run) -> dict:
    """The numerics machine every measured cell ran on (judge.numerics.numerics_key of its ranks' record); a run
    whose cells ran on more than one measures no single machine's noise: refused."""
    measured = measure(run)
    keys = {
        json.dumps(numerics_key(rec.get("machine")), sort_keys=True) for rec in run["cells"] if rec["id"] in measured
    }
    if len(keys) != 1 or keys == {"null"}:
        raise ValueError(
            f"the run's cells do not name one numerics machine ({len(keys)} seen: "
            f"{', '.join(sorted(keys))}): noise is measured on one"
        )
    return json.loads(keys.pop())


def render(doc) -> str:
    """The noise file of a stored run (its first matrix), as the shipped ones are written."""
    run = doc["runs"][0]
    meta = run["meta"]
    versions = {p: release(v) for p, v in (meta.get("versions") or {}).items() if p in ("torch", "torchtitan")}
    machine = machine_of(run)
    lines = [
        f"# each layout's noise: the largest relative difference from its baseline in a clean run of profile "
        f"{meta.get('profile')} ({meta.get('date', '')}, {len(run['cells'])} cells), made by",
        "# python -m pytest_simplefsdp.report RUN --format noise; a cell's tolerance is margin x its noise "
        "(at least floor, at most its lane's) on the versions and numerics machine measured_on names",
        f"# (measured on {meta.get('host') or 'a host'} with CPU flags {machine.get('flags') or 'unknown'})",
        "measured_on: {"
        + ", ".join(f"{p}: {v}" for p, v in versions.items())
        + ", machine: {"
        + ", ".join(f"{k}: {json.dumps(v)}" for k, v in machine.items())
        + "}}",
        f"margin: {MARGIN:g}",
        f"floor: {FLOOR:.1e}",
        "layouts:",
    ]
    for cell, row in measure(run).items():
        lines.append(f"  {cell}: {{" + ", ".join(f"{k}: {row[k]:.2e}" for k in NOISE_KINDS if k in row) + "}")
    return "\n".join(lines) + "\n"
