"""Which combination fails: what the hand-kept status list says in words ("PP + EP + compile: dynamic shapes"),
computed from the run alone (no extra cells). For each failure signature, the smallest set of axis values that
every cell failing with it shares and that no passing neighbour has, a neighbour being a cell of the run that
passed and differs from one of the failing cells in one axis."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from ..kinds import Status
from .tables import broken, rec_signature


@dataclass
class Combination:
    signature: str
    cells: list  # ids of the cells that fail with it
    values: list  # [(axis, value)]: what fails
    known: str | None = None  # the known-failure entry that names it, where one does
    separated: bool = True  # False: no passing neighbour ran, so ``values`` is only what the cells share

    def label(self):
        return " + ".join(f"{a}={v}" for a, v in self.values) or "(every cell)"


def _differ_by_one(a: dict, b: dict) -> bool:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b)) == 1


def failing_combinations(run) -> list[Combination]:
    # (a cell its baseline or seed checkpoint failed says nothing of its own combination)
    ran = [r for r in run["cells"] if r["status"] != Status.SKIPPED and not r.get("culprit")]
    passing = [r["axes"] for r in ran if broken(r) is False]
    by_signature = {}
    for r in ran:
        if broken(r) and r.get("failure_class"):
            by_signature.setdefault(rec_signature(r), []).append(r)
    out = []
    for signature, cells in by_signature.items():
        common = [(a, v) for a, v in cells[0]["axes"].items() if all(c["axes"].get(a) == v for c in cells[1:])]
        neighbours = [p for p in passing if any(_differ_by_one(p, c["axes"]) for c in cells)]
        values, separated = _smallest(common, neighbours, passing)
        out.append(Combination(signature, [c["id"] for c in cells], values,
                               next((c.get("known_failure") for c in cells if c.get("known_failure")), None), separated))
    return out


def _smallest(common, neighbours, passing):
    """The smallest subset of ``common`` that no neighbour matches whole; among those of a size, the one that the
    fewest passing cells match (the rarest values say most); ties in axis order."""
    if not neighbours:
        return common, False
    for size in range(1, len(common) + 1):
        found = [s for s in combinations(common, size)
                 if not any(all(n.get(a) == v for a, v in s) for n in neighbours)]
        if found:
            return list(min(found, key=lambda s: sum(all(p.get(a) == v for a, v in s) for p in passing))), True
    return common, False
