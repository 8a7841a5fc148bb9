"""Each mutant's kill and its margin: how far past its tolerance the check that killed it found the mutated run
(|cell - baseline| / (floor + rtol |baseline|); 2.0 is twice what the tolerance allowed). A numerics kill with a
margin near 1 is one a looser tolerance would have let through; evidence, invariant and exit kills are exact
checks (no margin). Not a test; it reads a stored run of the mutation tier and prints.

    pytest --simplefsdp-matrix --simplefsdp-mutants=all -k mutation --simplefsdp-json=mutants.json
    python benchmarks/kill_margins.py mutants.json [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def margin_of(rec: dict) -> tuple[str, float | None]:
    """(what was compared, its margin) of a mutated run's numerics kill; ('', None) for other kills."""
    rep = rec.get("numerics") or {}
    check = rep.get("check")
    if check == "loss":
        return f"loss at step {rep.get('first_differing_step')}", rep.get("margin")
    first = (rep.get("params") or {}).get("first_difference") if isinstance(rep.get("params"), dict) else None
    if check and first:
        return f"{first['kind']} of {first['param']} at step {first['step']}", first.get("margin")
    return "", None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a --simplefsdp-json document of a mutation-tier run")
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    rows = []
    for run in json.loads(a.run.read_text())["runs"]:
        for rec in run.get("mutants", []) + run["cells"]:  # (a run document keeps mutated runs apart)
            if not rec.get("mutant"):
                continue
            what, margin = margin_of(rec)
            shown = "exact" if what and margin is None else "-" if margin is None else f"{margin:.3g}"
            rows.append(
                (rec["mutant"], rec["id"].split("[")[0], rec.get("mutation"), rec.get("killed_by") or "", what, shown)
            )
    killed = sum(1 for r in rows if r[2] == "killed")
    margins = [float(r[5]) for r in rows if r[5] not in ("-", "exact")]
    print(
        f"{len(rows)} mutant runs, {killed} killed; numerics kills with a margin: {len(margins)}, smallest "
        f"{min(margins, default=math.nan):.3g}, median {sorted(margins)[len(margins) // 2] if margins else math.nan:.3g}"
    )
    if a.markdown:
        print("\n| mutant | cell | fate | killed by | first difference | margin |\n|---|---|---|---|---|---|")
        for r in sorted(rows):
            print("| " + " | ".join(f"`{x}`" if i < 2 else str(x) for i, x in enumerate(r)) + " |")
        return
    for r in sorted(rows):
        print("  ".join(str(x) for x in r))


if __name__ == "__main__":
    main()
