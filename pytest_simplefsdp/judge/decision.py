"""Step 5, decided once: a cell's pytest outcome and, under --simplefsdp-base, its class, from its result, the
known-failure entries that apply to it, its own runs (the confirming runs of a new failure) and the base's runs.
The live session runs the reruns and calls ``decide``; a stored run is judged again by the same call, with the
runs its records kept (``confirm``, ``base``). Nothing here runs anything."""

from __future__ import annotations

from dataclasses import dataclass

from ..kinds import GateClass, KnownKind, Status
from .gate import gate_class
from .history import flaky_verdict
from .known import Entry, KnownFailures, signature
from .results import CellResult
from .verdict import judge


@dataclass
class Decision:
    status: Status  # the pytest outcome
    verdict: str = ""
    entry: Entry | None = None  # the known-failures entry that judged it
    flaky: bool = False
    gate: GateClass | None = None  # under --simplefsdp-base: new, broken trunk, flaky or known (failures only)


def confirm_record(first, again: list) -> dict:
    """A new failure's runs (its first, failed, and the confirming ones), as its record keeps them."""
    passed = sum(1 for r in again if r.status == Status.PASSED)
    runs = 1 + len(again)
    signatures = list(
        dict.fromkeys(signature(r.error_text or r.error_line) for r in [first, *again] if r.failure_class)
    )
    return {
        "runs": runs,
        "passed": passed,
        "pass_rate": round(passed / runs, 3),
        "signatures": signatures,
        "folders": [r.log_dir for r in again],
    }


def own_runs_verdict(confirm: dict) -> tuple[bool, str]:
    """(flaky, verdict) of a new failure from its own runs."""
    runs, passed = confirm["runs"], confirm["passed"]
    if passed:
        return True, (
            f"flaky, new: passed {passed} of {runs} runs (no known-failures entry; "
            f"--simplefsdp-update-known-failures adds a kind: flaky entry with its pass rate)"
        )
    different = len(confirm.get("signatures") or [])
    return False, f"new: failed in every one of {runs} runs" + (
        f" ({different} different errors)" if different > 1 else ""
    )


def culprit_verdict(confirm: dict) -> str:
    return (
        f"not this cell's failure: {confirm['culprit']} failed in every one of its {confirm['culprit_runs']} "
        f"runs; the cell itself ran once"
    )


def decide(
    result,
    entries: list,
    gate=False,
    updating=False,
    confirm: dict | None = None,
    base: dict | None = None,
    gated: bool | None = None,
    history: dict | None = None,
) -> Decision:
    """The outcome of a finished cell. ``result``: what it did (its status before any verdict: passed, or failed
    with a class); ``entries``: the known failures that apply; ``confirm``: its own runs' record (a new failure
    confirmed, or the job that failed it run again); ``base``: the base's record of a failure asked about there
    (base_record; runs 0: it could not run there); ``gated``: the run is a PR's (--simplefsdp-base; default: a base
    record is given). A gated failure with no base record was never asked about there: it has no class.
    ``history``: the cell's earlier runs on its versions (judge.history.record): a failure they show failing the
    same way and passing since is flaky where its own runs did not say so."""
    v = judge(result, entries, gate, updating)
    d = Decision(v.outcome, v.message, v.entry, v.flaky)
    if result.status == Status.PASSED or not result.failure_class or v.entry is not None:
        if (base is not None if gated is None else gated) and v.entry is not None and d.status == Status.XFAILED:
            d.gate = GateClass.KNOWN
        return d
    if confirm and confirm.get("culprit"):  # its baseline or seed checkpoint failed: that job ran again
        if not confirm.get("culprit_passed"):
            d.verdict = culprit_verdict(confirm)
    elif confirm and confirm.get("runs", 1) > 1:
        d.flaky, d.verdict = own_runs_verdict(confirm)
    mine = result.signature or signature(result.error_text or result.error_line)
    if not d.flaky and not (confirm and confirm.get("culprit")):
        earlier = flaky_verdict(history, mine)
        if earlier:
            d.flaky, d.verdict = True, earlier
    if base is not None:
        d.gate, d.verdict = gate_class(mine, d.flaky, d.verdict, base)
        if d.gate != GateClass.NEW:
            d.status = Status.XFAILED
    return d


def record_decision(result, d: Decision):
    """Write a decision into the result: status, verdict, flaky, signature, known failure, gate class."""
    result.signature = signature(result.error_text or result.error_line)
    result.status, result.verdict, result.flaky, result.gate = d.status, d.verdict, d.flaky, d.gate
    result.known_failure = d.entry.id if d.entry else None
    result.known_failure_link = d.entry.link if d.entry else None


def rejudge(rec: dict, known: KnownFailures, env: dict, gate: bool = False, base: dict | None = None) -> dict:
    """A stored cell's record judged again against a known-failures file (a run rendered elsewhere, or after
    the file changed): what the run did (passed, or failed with which class and error) and the runs it kept (its
    confirming runs, the base's) are kept; the verdict, the known failure, the pytest outcome and the gate class are
    decided again, as the live run decides them (decision.decide). ``base``: the run's base (its meta record), where
    it was a PR's. Mutated runs keep their mutation verdict."""
    if rec.get("mutant"):
        return rec
    entries = known.for_cell(rec["axes"], env)
    if rec["status"] == Status.SKIPPED:  # it never ran: only a skip entry can say why now
        skip = next((e for e in entries if e.kind == KnownKind.SKIP), None)
        if skip:
            return dict(rec, known_failure=skip.id, known_failure_link=skip.link, verdict=skip.reason)
        if rec.get("known_failure"):
            return dict(
                rec,
                known_failure=None,
                known_failure_link=None,
                verdict=f"not run: entry {rec['known_failure']} skipped it; no skip entry applies now",
            )
        return rec
    result = CellResult.from_record(rec)
    result.status = Status.FAILED if rec.get("failure_class") else Status.PASSED  # before any verdict
    result.signature = ""
    d = decide(
        result,
        entries,
        gate,
        confirm=rec.get("confirm"),
        base=rec.get("base"),
        gated=base is not None,
        history=rec.get("history"),
    )
    record_decision(result, d)
    fresh = result.record()
    return {
        **rec,
        **{
            k: fresh[k]
            for k in ("status", "verdict", "flaky", "signature", "known_failure", "known_failure_link", "gate")
        },
    }
