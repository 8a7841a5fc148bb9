"""Step 5, its first half: judge a cell's result against the known-failure entries that apply to it (known.py): the
pytest outcome it gets, with the entry and the message. decision.py adds its own runs and the base's."""

from __future__ import annotations

from dataclasses import dataclass

from ..kinds import KnownKind, Status
from .known import Entry, outside_window, signature


@dataclass
class Verdict:
    outcome: Status  # the pytest outcome the cell gets
    entry: Entry | None = None
    message: str = ""
    flaky: bool = False


def judge(result, entries: list, gate: bool, updating=False) -> Verdict:
    """The pytest outcome of a finished cell, given the known-failure entries that apply to it (``updating``: this run
    rewrites the known-failures file at its end)."""
    expected = [e for e in entries if e.kind in (KnownKind.XFAIL, KnownKind.FLAKY)]
    if result.status == Status.PASSED:
        flaky = next((e for e in expected if e.kind == KnownKind.FLAKY), None)
        if flaky:
            return Verdict(Status.PASSED, flaky, f"known flaky {flaky.label()} passed this time", flaky=True)
        versions = getattr(result, "versions", None)
        xfails = [e for e in expected if e.kind == KnownKind.XFAIL]
        xfail = next((e for e in xfails if not outside_window(e, versions)), None)
        if xfails and xfail is None:  # it passes where the entry's own window says it does (a fixed release)
            e = xfails[0]
            return Verdict(
                Status.PASSED,
                None,
                f"passes, as known failure {e.label()}'s window says: {outside_window(e, versions)}",
            )
        if xfail:
            how = (
                "this run's --simplefsdp-update-known-failures removes it if every cell it covers passes"
                if updating
                else "or run --simplefsdp-update-known-failures"
            )
            msg = f"known failure {xfail.id} no longer fails: delete it from {xfail.where} ({how}); {xfail.link}"
            return Verdict(Status.FAILED if gate else Status.XPASSED, xfail, msg)
        return Verdict(Status.PASSED)
    sig = signature(result.error_text or result.error_line)
    raw = result.error_text or result.error_line or ""
    for e in expected:
        if e.classes and result.failure_class not in e.classes:
            continue
        if e.pattern.search(sig) or e.pattern.search(raw):
            outside = outside_window(e, getattr(result, "versions", None))
            if outside:  # the entry's own window says this cell should pass here
                return Verdict(
                    Status.FAILED,
                    None,
                    f"fails as known failure {e.label()} says, but {outside}: its "
                    f"window is wrong, or this is another regression",
                )
            return Verdict(Status.XFAILED, e, f"known failure {e.label()}: {e.reason}", flaky=e.kind == KnownKind.FLAKY)
    if expected:
        wanted = "; ".join(f"{e.id}: /{e.error}/" for e in expected)
        return Verdict(Status.FAILED, None, f"failed with a different error than known: expected {wanted}; got: {sig}")
    return Verdict(Status.FAILED)
