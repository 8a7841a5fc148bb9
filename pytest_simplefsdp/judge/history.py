"""A cell's history read as evidence about a failure (store.history keeps the rows): a new failure whose
signature failed on these versions before and passed since is flaky, not new. Pure: the rows come in the
result's ``history`` record, so a stored run is judged again from what it kept."""

from __future__ import annotations

from ..kinds import Status


def record(rows: list, store: str) -> dict:
    """What a result keeps of its cell's history: the rows it was judged with (newest first) and the store."""
    return {"store": store, "runs": rows}


def pass_rate(rows: list) -> tuple[int, int]:
    """(passed, runs) over the rows."""
    return sum(1 for r in rows if r["status"] == Status.PASSED and not r.get("failure_class")), len(rows)


def flaky_verdict(history: dict | None, signature: str) -> str | None:
    """The verdict of a failure with ``signature`` that its history shows as intermittent: the same signature
    failed in an earlier run on these versions and a later run passed. None where it does not."""
    if not history:
        return None
    rows = history.get("runs") or []
    for newer, row in enumerate(rows):
        if row.get("failure_class") and row.get("signature") == signature:
            passed_since = [r for r in rows[:newer] if r["status"] == Status.PASSED and not r.get("failure_class")]
            if passed_since:
                passed, runs = pass_rate(rows)
                return (
                    f"flaky, new: failed the same way in run {row['run']} ({row['at']}) and passed since, in "
                    f"run {passed_since[-1]['run']}, on these versions: passed {passed} of its last {runs} "
                    f"runs (history {history['store']})"
                )
    return None
