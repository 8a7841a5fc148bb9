"""Step 5: judge a cell's result against the known-failure entries that apply to it (known.py): the pytest
outcome it gets, with the entry and the message; and a stored record judged again against another file."""

from __future__ import annotations

from dataclasses import dataclass

from ..kinds import GateClass, KnownKind, Status
from .known import Entry, KnownFailures, outside_window, signature
from .results import CellResult


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
            return Verdict(Status.PASSED, None, f"passes, as known failure {e.label()}'s window says: "
                                                f"{outside_window(e, versions)}")
        if xfail:
            how = ("this run's --simplefsdp-update-known-failures removes it if every cell it covers passes" if updating
                   else "or run --simplefsdp-update-known-failures")
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
                return Verdict(Status.FAILED, None, f"fails as known failure {e.label()} says, but {outside}: its "
                                                    f"window is wrong, or this is another regression")
            return Verdict(Status.XFAILED, e, f"known failure {e.label()}: {e.reason}", flaky=e.kind == KnownKind.FLAKY)
    if expected:
        wanted = "; ".join(f"{e.id}: /{e.error}/" for e in expected)
        return Verdict(Status.FAILED, None, f"failed with a different error than known: expected {wanted}; got: {sig}")
    return Verdict(Status.FAILED)


def apply(result, entries: list, gate: bool, updating=False) -> Verdict:
    """Judge a result and write the verdict into it: status, verdict text, flaky, signature, known failure."""
    verdict = judge(result, entries, gate, updating)
    result.signature = signature(result.error_text or result.error_line)
    result.status, result.verdict, result.flaky = verdict.outcome, verdict.message, verdict.flaky
    result.known_failure = verdict.entry.id if verdict.entry else None
    result.known_failure_link = verdict.entry.link if verdict.entry else None
    return verdict


def rejudge(rec: dict, known: KnownFailures, env: dict, gate: bool = False) -> dict:
    """A stored cell's record judged again against a known-failures file (a run rendered elsewhere, or after
    the file changed): what the run did (passed, or failed with which class and error) is kept; the verdict,
    the known failure and the pytest outcome are redone. Mutated runs keep their mutation verdict."""
    if rec.get("mutant"):
        return rec
    entries = known.for_cell(rec["axes"], env)
    if rec["status"] == Status.SKIPPED:  # it never ran: only a skip entry can say why now
        skip = next((e for e in entries if e.kind == KnownKind.SKIP), None)
        if skip:
            return dict(rec, known_failure=skip.id, known_failure_link=skip.link, verdict=skip.reason)
        if rec.get("known_failure"):
            return dict(rec, known_failure=None, known_failure_link=None,
                        verdict=f"not run: entry {rec['known_failure']} skipped it; no skip entry applies now")
        return rec
    result = CellResult.from_record(rec)
    result.status = Status.FAILED if rec.get("failure_class") else Status.PASSED  # before any verdict
    verdict = apply(result, entries, gate)
    if rec.get("gate"):  # judged against a PR's base (judge.gate): an entry makes it known; else its class stands
        if verdict.entry is not None and result.status == Status.XFAILED:
            result.gate = GateClass.KNOWN
        elif result.status == Status.FAILED and rec["gate"] != GateClass.KNOWN:
            result.gate, result.verdict = rec["gate"], rec.get("verdict", "")
            result.status = Status.FAILED if result.gate == GateClass.NEW else Status.XFAILED
        elif result.status == Status.FAILED:
            result.gate = None  # its entry no longer applies, and the base never ran it: unclassified
    fresh = result.record()
    return {**rec, **{k: fresh[k] for k in ("status", "verdict", "flaky", "signature", "known_failure",
                                            "known_failure_link", "gate")}}


