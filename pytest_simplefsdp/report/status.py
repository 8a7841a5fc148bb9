"""The status by feature: what the hand-kept status checklist said, rolled up from a run's cells, never saying
more than what ran. A feature is Done only when every valid cell with it ran in this run and passed; Partly run
when some did not run (a ``-k`` or interrupted run); In progress when the rest fail as known failures; Failing when
one failed with a new error; Not run when none ran."""

from __future__ import annotations

from ..degrees import DEGREES
from ..judge.gate import UNGATED
from ..kinds import Status
from ..words import plural
from .tables import broken

# the features of the status-tracking issue (torchtitan 1980), each the axis values that turn it on
FEATURE_GROUPS = (
    ("Parallelisms", {d.axis: d.label for d in DEGREES}),  # (degrees.py, the one table)
    ("Compile modes", {"compile": "compile {}", "backend": "backend {}"}),
    ("Memory policies", {"memory_policy": "memory policy {}", "ac": "activation checkpointing {}"}),
    ("PP schedules", {"pp_schedule": "{}"}),
    ("Models", {"model": "{}"}),
    ("Features", {"feature": "{}", "trainer": "trainer {}"}),
)
DONE, PARTLY, IN_PROGRESS, FAILING, NOT_RUN = "Done", "Partly run", "In progress", "Failing", "Not run"


def valid_cells(run):
    """Every valid cell of the matrix as {id, axes}: the meta record's list (runs stored before it had axes: the
    cells that ran)."""
    places = [p for p in run["meta"].get("valid", []) if p.get("axes") is not None]
    return places or [{"id": r["id"], "axes": r["axes"]} for r in run["cells"]]


def _has(axes, axis, value):
    if isinstance(value, int) and not isinstance(value, bool):
        return (axes.get(axis) or 0) > 1
    return axes.get(axis) == value


def features(run):
    """[(group, [Feature])] of one matrix: per feature its valid cells, the records of those that ran, its state."""
    valid, ran = valid_cells(run), {r["id"]: r for r in run["cells"]}
    out = []
    for group, axes in FEATURE_GROUPS:
        rows, names = [], set()
        for axis, label in axes.items():
            for value in dict.fromkeys(c["axes"][axis] for c in valid if axis in c["axes"]):
                numeric = isinstance(value, int) and not isinstance(value, bool)
                if value == "none" or (numeric and value <= 1):
                    continue
                name = label if numeric else label.format(value)
                if name in names:
                    continue
                names.add(name)
                cells = [c for c in valid if _has(c["axes"], axis, value)]
                rows.append(Feature(name, len(cells), [ran[c["id"]] for c in cells if c["id"] in ran]))
        if rows:
            out.append((group, rows))
    return out


class Feature:
    def __init__(self, name, valid: int, records: list):
        self.name, self.valid, self.records = name, valid, records
        # (a cell its baseline or seed checkpoint failed did not show anything of its own: not counted as run)
        ran = [r for r in records if r["status"] != Status.SKIPPED and not r.get("culprit")]
        self.ran, self.passed = len(ran), sum(1 for r in ran if broken(r) is False)
        self.entries = list(
            dict.fromkeys(
                (r["known_failure"], r.get("known_failure_link"))
                for r in records
                if r.get("known_failure") and r["status"] in (Status.XFAILED, Status.SKIPPED)
            )
        )
        # (a gate's XPASS has no failure class; a PR's failure the base shares, or whose runs disagree, is an
        # expected failure of the PR gate with no entry, and fails all the same)
        if any((r["status"] == Status.FAILED and r.get("failure_class")) or r.get("gate") in UNGATED for r in ran):
            self.state = FAILING
        elif not ran:
            self.state = NOT_RUN
        elif self.ran < self.valid:
            self.state = PARTLY
        elif self.entries:
            self.state = IN_PROGRESS
        else:
            self.state = DONE

    def counts(self):
        """ "3 of 12 cells run, 3 pass" (only when some did not run), else "3 of 3 cells pass"."""
        if self.ran < self.valid:
            return f"{self.ran} of {plural(self.valid, 'cell')} run, {self.passed} pass"
        return f"{self.passed} of {plural(self.valid, 'cell')} pass{'es' if self.passed == 1 else ''}"
