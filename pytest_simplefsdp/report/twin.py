"""Twin runs: the same cells on two version sets side by side (--simplefsdp-twin, or two values of the `versions`
axis), and one table of the cells whose verdict, failure signature or numerics differ between them. Numerics: the
twins' losses are bitwise equal, within the cell's numerics lane, or out of it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..versions.sets import INSTALLED, parse
from ..words import plural
from .tables import rec_signature

BITWISE, WITHIN, OUT, NONE = "bitwise", "within lane", "out of lane", "-"


@dataclass
class Twin:
    cell: str  # the cell id without its version set
    a: dict  # the record on the first set
    b: dict  # ... on the second

    def numerics(self) -> str:
        la, lb = self.a.get("losses") or {}, self.b.get("losses") or {}
        if not la or not lb or set(la) != set(lb):
            return NONE
        if all(la[s] == lb[s] for s in la):
            return BITWISE
        lane = self.a.get("numerics") or self.b.get("numerics") or {}
        rtol, atol = lane.get("rtol", 0.0), lane.get("atol", 0.0)
        close = all(
            x is not None
            and y is not None
            and math.isfinite(x)
            and math.isfinite(y)
            and abs(x - y) <= atol + rtol * abs(x)
            for x, y in ((la[s], lb[s]) for s in la)
        )
        return WITHIN if close and (rtol or atol) else OUT

    def differs(self) -> bool:
        return (
            self.a["status"] != self.b["status"]
            or rec_signature(self.a) != rec_signature(self.b)
            or self.numerics() in (WITHIN, OUT)
        )


def twins(run, first: str, second: str) -> list[Twin]:
    """The cells of a run that ran on both version sets (labels ``first`` and ``second``), paired by their other axes."""
    by_set = {first: {}, second: {}}
    for rec in run["cells"]:
        label = rec["axes"].get("versions", INSTALLED)
        if label in by_set:
            rest = tuple(sorted((k, str(v)) for k, v in rec["axes"].items() if k != "versions"))
            by_set[label][rest] = rec
    return [
        Twin(a["id"].replace(f"-{_slug(first)}", ""), a, by_set[second][k])
        for k, a in by_set[first].items()
        if k in by_set[second]
    ]


def _slug(label):
    return parse(label).slug()


def rows(pairs, first, second) -> list[tuple]:
    """The twin table: (cell, first's verdict, second's verdict, numerics, what differs) of every pair that differs."""
    out = []
    for t in pairs:
        if not t.differs():
            continue
        what = []
        if t.a["status"] != t.b["status"]:
            what.append("verdict")
        if rec_signature(t.a) != rec_signature(t.b):
            what.append(f"signature: {(rec_signature(t.b) or '-')[:80]}")
        out.append((t.cell, _verdict(t.a), _verdict(t.b), t.numerics(), "; ".join(what) or "numerics"))
    return out


def _verdict(rec):
    return (
        f"{rec['status']}"
        + (f" {rec['failure_class']}" if rec.get("failure_class") else "")
        + f" {rec.get('wall', 0):.0f}s"
        + (" (outside the target's range)" if rec.get("outside_range") else "")
    )


def summary(pairs, first, second) -> str:
    same = sum(1 for t in pairs if not t.differs())
    bitwise = sum(1 for t in pairs if t.numerics() == BITWISE)
    differ = len(pairs) - same
    return (
        f"twin run {first} vs {second}: {plural(len(pairs), 'cell')} on both; {same} behave"
        f"{'s' if same == 1 else ''} the same ({bitwise} with bitwise equal losses); {differ} differ"
        f"{'s' if differ == 1 else ''}"
    )
