"""``report HISTORY --format history``: each cell's streak from the history store (store.history), per profile
and versions: its last runs' pass rate, the current streak and its newest failure."""

from __future__ import annotations

from tabulate import tabulate

from ..judge.history import pass_rate
from ..kinds import Status


def streak(rows: list) -> str:
    """The newest run's outcome and how many runs in a row ended so (rows newest first)."""

    def word(r):
        return Status.FAILED if r.get("failure_class") else str(r["status"])

    first = word(rows[0])
    n = next((i for i, r in enumerate(rows) if word(r) != first), len(rows))
    return f"{n} {first}" + ("+" if n == len(rows) and n > 1 else "")


def render(streaks: list, last: int) -> str:
    if not streaks:
        return "history: no cell recorded yet\n"
    table = []
    for profile, cell, versions, rows in streaks:
        passed, runs = pass_rate(rows)
        failure = next((r for r in rows if r.get("failure_class")), None)
        table.append(
            [
                profile,
                cell,
                ", ".join(f"{k} {v}" for k, v in versions.items()),
                f"{passed}/{runs}",
                streak(rows),
                f"{failure['at']}: [{failure['failure_class']}] {(failure['signature'] or '')[:60]}"
                if failure
                else "-",
            ]
        )
    flaky = sum(
        1
        for *_, rows in streaks
        if {bool(r.get("failure_class")) for r in rows if r["status"] != Status.SKIPPED} == {True, False}
    )
    head = (
        f"history: {len(streaks)} cells (per profile and versions), their last {last} runs at most; "
        f"{flaky} both passed and failed in them\n"
    )
    return head + tabulate(table, headers=["profile", "cell", "versions", "passed", "streak", "newest failure"]) + "\n"
