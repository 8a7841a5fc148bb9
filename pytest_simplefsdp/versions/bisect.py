"""Bisection over an ordered list of versions (torch releases, nightlies, torchtitan commits) to the window where a
cell's behaviour changes: the last version that behaves like one end and the first that behaves like the other.

A probe runs the cell on one version ``confirm`` times; it counts only when every run agrees (a flake must not steer
the search). Its outcome is ``fails`` (with the signature being bisected), ``passes``, ``other`` (another error: a
finding of its own, skipped like ``git bisect skip``), ``untestable`` (no environment for it, or the cell failed
before training on an API mismatch: skipped) or ``flaky`` (the runs disagreed: skipped). When the two ends behave
alike there is no window to find, and the search says so without probing further."""

from __future__ import annotations

from dataclasses import dataclass, field

FAILS, PASSES, OTHER, UNTESTABLE, FLAKY = "fails", "passes", "other", "untestable", "flaky"
DECISIVE = (FAILS, PASSES)


@dataclass
class Probe:
    version: str
    outcome: str
    signature: str = ""  # the error of a failing run (the bisected one, or another)
    line: str = ""  # what the outcome rests on: the error line, the installer's line
    walls: list = field(default_factory=list)  # seconds of each run
    runs: list = field(default_factory=list)  # each run's outcome (confirm runs)
    outside: str = ""  # where the version leaves the target's supported range (bisected on purpose)

    def record(self):
        return {
            "version": self.version,
            "outcome": self.outcome,
            "signature": self.signature,
            "line": self.line,
            "walls": self.walls,
            "runs": self.runs,
            "outside_range": self.outside,
        }


@dataclass
class Bisection:
    versions: list  # the ordered list searched
    probes: list = field(default_factory=list)  # every Probe, in the order they ran
    window: tuple | None = None  # (last version like the first end, first version like the last end)
    message: str = ""  # why there is no window (ends alike, untestable ends)

    def record(self):
        return {
            "versions": self.versions,
            "window": list(self.window) if self.window else None,
            "message": self.message,
            "probes": [p.record() for p in self.probes],
        }


def bisect(versions, probe, known: dict | None = None) -> Bisection:
    """Search ``versions`` (ordered) with ``probe(version) -> Probe``; ``known``: version -> Probe already run (the
    run's own cell), reused instead of probing again."""
    out = Bisection(list(versions))
    seen = dict(known or {})

    def look(i):
        v = versions[i]
        if v not in seen:
            seen[v] = probe(v)
        if seen[v] not in out.probes:
            out.probes.append(seen[v])
        return seen[v]

    lo = next((i for i in range(len(versions)) if look(i).outcome in DECISIVE), None)
    hi = next(
        (i for i in reversed(range(len(versions))) if lo is not None and i > lo and look(i).outcome in DECISIVE), None
    )
    if lo is None or hi is None:
        out.message = "fewer than two versions of the list could be judged: no window"
        return out
    if seen[versions[lo]].outcome == seen[versions[hi]].outcome:
        out.message = (
            f"both ends {seen[versions[lo]].outcome} ({versions[lo]} and {versions[hi]}): nothing to "
            f"bisect in this list"
        )
        return out
    low, high = seen[versions[lo]].outcome, seen[versions[hi]].outcome
    while True:
        inside = [i for i in range(lo + 1, hi) if versions[i] not in seen or seen[versions[i]].outcome in DECISIVE]
        if not inside:
            break
        middle = (lo + hi) / 2
        i = min(inside, key=lambda k: (abs(k - middle), k))  # the middle, else the nearest one not skipped
        p = look(i)
        if p.outcome == low:
            lo = i
        elif p.outcome == high:
            hi = i
        # (other, untestable, flaky: skipped; the next try is the nearest other version inside)
    out.window = (versions[lo], versions[hi])
    return out


def judge_runs(version, runs) -> Probe:
    """One probe from its ``confirm`` runs, each (outcome, signature, line, wall): the outcome when all agree
    (untestable wins: it does not depend on luck), else flaky."""
    outcomes = [r[0] for r in runs]
    first = runs[0]
    if UNTESTABLE in outcomes:
        outcome = UNTESTABLE
        first = next(r for r in runs if r[0] == UNTESTABLE)
    elif len(set(outcomes)) == 1:
        outcome = outcomes[0]
    else:
        outcome = FLAKY
    return Probe(version, outcome, first[1], first[2], [r[3] for r in runs], outcomes)


def table(b: Bisection) -> list[tuple]:
    """(version, outcome, runs, signature or line, wall) per version tried, in list order."""
    order = {v: i for i, v in enumerate(b.versions)}
    rows = []
    for p in sorted(b.probes, key=lambda p: order.get(p.version, -1)):
        runs = "/".join(p.runs) if len(set(p.runs)) > 1 else f"{len(p.runs)}x {p.outcome}" if p.runs else "-"
        version = p.version + (" (outside the target's range)" if p.outside else "")
        rows.append((version, p.outcome, runs, (p.signature or p.line)[:100], f"{sum(p.walls):.0f}s"))
    return rows
