"""A cell's history read as a reason to look harder at a failure (store.history keeps the rows): a new failure whose
signature failed on these versions before and passed since gets more confirming runs; only a run of this session
that passes makes it flaky. Pure: the rows come in the result's ``history`` record."""

from __future__ import annotations

from ..kinds import Status


def record(rows: list, store: str) -> dict:
    """What a result keeps of its cell's history: the rows it was judged with (newest first) and the store."""
    return {"store": store, "runs": rows}


def pass_rate(rows: list) -> tuple[int, int]:
    """(passed, runs) over the rows."""
    return sum(1 for r in rows if r["status"] == Status.PASSED and not r.get("failure_class")), len(rows)


def flaky_past(history: dict | None, signature: str) -> tuple[str, float] | None:
    """What the cell's history says of a failure with ``signature``: (words, the history's pass rate) where the same
    signature failed in an earlier run on these versions and a later run passed, else None. A reason to run the
    failure more times in this run (judge.decision.runs_to_pass), never a verdict: history keys by versions, so a
    regression on uncommitted edits shares its key with the flake it resembles."""
    if not history:
        return None
    rows = history.get("runs") or []
    for newer, row in enumerate(rows):
        if row.get("failure_class") and row.get("signature") == signature:
            passed_since = [r for r in rows[:newer] if r["status"] == Status.PASSED and not r.get("failure_class")]
            if passed_since:
                passed, runs = pass_rate(rows)
                return (
                    f"its history shows it flaky: it failed the same way in run {row['run']} ({row['at']}) and "
                    f"passed since, in run {passed_since[-1]['run']}; passed {passed} of its last {runs} runs "
                    f"(history {history['store']})",
                    passed / runs,
                )
    return None
