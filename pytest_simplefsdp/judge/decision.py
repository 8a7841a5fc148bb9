"""Step 5, decided once: a cell's pytest outcome and, under --simplefsdp-base, its class, from its result, the
known-failure entries that apply to it, its own runs (the confirming runs of a new failure) and the base's runs.
The live session runs the reruns and calls ``decide``; a stored run is judged again by the same call, with the
runs its records kept (``confirm``, ``base``). Nothing here runs anything."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kinds import GateClass, KnownKind, Status
from .gate import ADDED, gate_class
from .history import flaky_past
from .identity import identity
from .known import Entry, KnownFailures
from .results import CellResult
from .verdict import judge

LIKELY = 0.99  # a failure said to be flaky is run until a pass is this likely by its pass rate
MOST_RUNS = 10  # ... but never more often than this (a rate of 0.3 would ask for 13)


@dataclass
class Decision:
    status: Status  # the pytest outcome
    verdict: str = ""
    entry: Entry | None = None  # the known-failures entry that judged it
    flaky: bool = False
    gate: GateClass | None = None  # under --simplefsdp-base: new, broken trunk, flaky or known (failures only)
    proving: Entry | None = None  # a kind: flaky entry its failure matches: proven only by a run that passes


def runs_to_pass(rate: float) -> int:
    """How many runs (the failed one included) make a pass LIKELY for a cell that passes ``rate`` of its runs
    (0.5: 7, 0.8: 3), at most MOST_RUNS."""
    if rate >= 1:
        return 2
    if rate <= 0:
        return MOST_RUNS
    return max(2, min(MOST_RUNS, math.ceil(math.log(1 - LIKELY) / math.log(1 - rate))))


def confirm_record(first, again: list, why: str = "") -> dict:
    """A failure's runs (its first, failed, and the confirming ones), as its record keeps them; ``why``: what asked
    for more runs than --simplefsdp-confirm (a flaky entry's pass rate, the cell's history)."""
    passed = sum(1 for r in again if r.status == Status.PASSED)
    runs = 1 + len(again)
    signatures = list(dict.fromkeys(r.signature or identity(r) for r in [first, *again] if r.failure_class))
    return {
        "runs": runs,
        "passed": passed,
        "pass_rate": round(passed / runs, 3),
        "signatures": signatures,
        "folders": [r.log_dir for r in again],
        **({"why": why} if why else {}),
    }


def flaky_entry_verdict(entry: Entry, confirm: dict | None) -> tuple[Status, str]:
    """A failure a kind: flaky entry matches: xfailed where one of its runs in this run passed, else new, naming the
    entry (an entry's word is no proof: a deterministic regression matches a flaky entry's pattern as well)."""
    rate = f"entry {entry.label()} says it passes {entry.pass_rate:.0%} of runs"
    runs, passed = (confirm or {}).get("runs", 1), (confirm or {}).get("passed", 0)
    if passed:
        return (
            Status.XFAILED,
            f"known flaky {entry.label()}: failed, and passed {passed} of {runs} runs: {entry.reason}",
        )
    if runs <= 1:
        return Status.FAILED, f"new: {rate}, but it was not run again, and only a run that passes shows it flaky"
    return Status.FAILED, f"new: {rate}; it failed {runs} of {runs}"


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
    base_entries: list | tuple | None = None,
) -> Decision:
    """The outcome of a finished cell. ``result``: what it did (its status before any verdict: passed, or failed
    with a class); ``entries``: the known failures that apply; ``confirm``: its own runs' record (a failure run
    again, or the job that failed it run again); ``base``: the base's record of a failure asked about there
    (base_record; runs 0: it could not run there); ``gated``: the run is a PR's (--simplefsdp-base; default: a base
    record is given). A gated failure with no base record was never asked about there: it has no class.
    Flaky is earned in this run: a failure is flaky only where one of its own runs passed (or, gated, the base
    failed the same way in some run); a kind: flaky entry is proven the same way. ``history``: the cell's earlier
    runs on its versions (judge.history.record): a flaky past got it more runs, and its verdict says so, but never
    makes it flaky. ``base_entries``: the entry ids of the base's known-failures file (Base.entries): a gated
    failure xfailed by an entry not among them says so."""
    v = judge(result, entries, gate, updating)
    d = Decision(v.outcome, v.message, v.entry, v.flaky)
    failed = result.status != Status.PASSED and bool(result.failure_class)
    if failed and v.entry is not None and v.entry.kind == KnownKind.FLAKY:
        d.status, d.verdict = flaky_entry_verdict(v.entry, confirm)
        if d.status == Status.FAILED:  # refuted (or not yet rerun): a new failure, judged as any other
            d.entry, d.flaky, d.proving = None, False, v.entry
    gated = base is not None if gated is None else gated
    if not failed or d.entry is not None:
        if gated and d.entry is not None and d.status == Status.XFAILED:
            d.gate = GateClass.KNOWN
            if base_entries is not None and d.entry.id not in base_entries:
                d.verdict = f"{ADDED} (the base's known-failures file has no {d.entry.id}): {d.verdict}"
        return d
    mine, note = result.signature or identity(result), ""
    if confirm and confirm.get("culprit"):  # its baseline or seed checkpoint failed: that job ran again
        if not confirm.get("culprit_passed"):
            d.verdict = culprit_verdict(confirm)
    elif d.proving is None and confirm and confirm.get("runs", 1) > 1:
        d.flaky, d.verdict = own_runs_verdict(confirm)
        past = flaky_past(history, mine)
        if past and not d.flaky:
            note = f"{past[0]}, so it was run more times, and failed every one"
            d.verdict += f"; {note}"
    if base is not None:
        # what the gate's words would drop: the flaky entry it refuted, the flaky past it ran more times for
        kept = d.verdict.removeprefix("new: ") if d.proving is not None else note
        d.gate, d.verdict = gate_class(mine, d.flaky, d.verdict, base)
        d.verdict += f"; {kept}" if kept else ""
        if d.gate != GateClass.NEW:
            d.status = Status.XFAILED
    return d


def record_decision(result, d: Decision):
    """Write a decision into the result: status, verdict, flaky, signature, known failure, gate class."""
    result.signature = identity(result)
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
        base_entries=(base or {}).get("entries"),
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
