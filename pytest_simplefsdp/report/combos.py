"""Which combination fails: what the hand-kept status list says in words ("PP + EP + compile: dynamic shapes"),
computed from the run alone (no extra cells). For each failure signature (numbers normalised out), the values every
cell failing with it shares and no passing cell has (judge.combination)."""

from __future__ import annotations

from dataclasses import dataclass

from ..judge.combination import label, needs
from ..kinds import Status
from .tables import broken, rec_signature


@dataclass
class Combination:
    signature: str
    cells: list  # ids of the cells that fail with it
    values: list  # [(axis, value)]: what fails
    known: str | None = None  # the known-failure entry that names it, where one does
    separated: bool = True  # False: no passing cell tells them apart, so ``values`` is only what the cells share

    def label(self):
        return label(self.values)


def failing_combinations(run) -> list[Combination]:
    # (a cell its baseline or seed checkpoint failed says nothing of its own combination)
    ran = [r for r in run["cells"] if r["status"] != Status.SKIPPED and not r.get("culprit")]
    passing = [r["axes"] for r in ran if broken(r) is False]
    by_signature = {}
    for r in ran:
        if broken(r) and r.get("failure_class"):
            by_signature.setdefault(rec_signature(r), []).append(r)
    out = []
    for sig, cells in by_signature.items():
        found = needs([c["axes"] for c in cells], passing)
        out.append(
            Combination(
                sig,
                [c["id"] for c in cells],
                found.values,
                next((c.get("known_failure") for c in cells if c.get("known_failure")), None),
                found.separated,
            )
        )
    return out
