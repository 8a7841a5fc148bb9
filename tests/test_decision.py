"""One decision for a failure's class (judge.decision.decide), in-process on canned results: every combination of
its own runs, the base's runs and the known failures, as the live run and the report tool both reach it."""

import pytest

from pytest_simplefsdp.judge.decision import confirm_record, decide, rejudge
from pytest_simplefsdp.judge.gate import Base, base_record
from pytest_simplefsdp.judge.known import Entry
from pytest_simplefsdp.judge.results import CellResult
from pytest_simplefsdp.kinds import FailureClass, GateClass, KnownKind, Status

BASE = Base("main", "0123456789ab", "/repo")
BOOM, OTHER = "RuntimeError: boom", "ValueError: another"


def ran(error=None, not_run=False):
    r = CellResult("c", {"mode": "m"}, log_dir="/logs/c")
    if error:
        r.fail(FailureClass.INFRA if not_run else FailureClass.RUNTIME, error)
    r.not_run = not_run
    return r


def entry(kind=KnownKind.XFAIL, error="boom"):
    import re2

    return Entry(
        id="known-one",
        when={},
        error=error,
        kind=kind,
        link="https://github.com/pytorch/torchtitan/issues/1",
        reason="a known bug",
        pattern=re2.compile(error),
        where="kf.yaml",
    )


def case(own, base_runs, entries=()):
    """A cell that failed with BOOM, its confirming runs ``own`` (errors, None: passed) and its base runs."""
    first = ran(BOOM)
    confirm = confirm_record(first, [ran(e) for e in own]) if own else None
    base = None if base_runs is None else base_record([ran(e, n) for e, n in base_runs], BASE)
    return first, decide(first, list(entries), confirm=confirm, base=base, gated=True)


TABLE = {  # name: (own confirming runs, base runs (error, not run), entries) -> (status, gate, verdict start)
    "new: passes on the base": (
        ([BOOM], [(None, False), (None, False)], ()),
        (Status.FAILED, GateClass.NEW, "new: fails here, passes on base main (0123456789ab) (2 of 2 runs)"),
    ),
    "new: fails there differently": (
        ([BOOM], [(OTHER, False)], ()),
        (
            Status.FAILED,
            GateClass.NEW,
            f"new: fails on base main (0123456789ab) too, but differently; here: {BOOM}; base: {OTHER}",
        ),
    ),
    "broken trunk": (
        ([BOOM], [(BOOM, False), (BOOM, False)], ()),
        (
            Status.XFAILED,
            GateClass.BROKEN_TRUNK,
            f"broken trunk: fails on base main (0123456789ab) too, with the same signature (2 of 2 runs): {BOOM}",
        ),
    ),
    "flaky here": (([None], [], ()), (Status.XFAILED, GateClass.FLAKY, "flaky, new: passed 1 of 2 runs")),
    "flaky on the base": (
        ([BOOM], [(BOOM, False), (None, False)], ()),
        (Status.XFAILED, GateClass.FLAKY, "flaky: fails here, and on base main (0123456789ab) passed 1 of 2 runs"),
    ),
    "known": (([], None, (entry(),)), (Status.XFAILED, GateClass.KNOWN, "known failure known-one")),
    "known flaky": (([], None, (entry(KnownKind.FLAKY),)), (Status.XFAILED, GateClass.KNOWN, "known failure")),
    "base could not run": (
        ([BOOM], [("no environment for torchtitan@0123456789ab: uv failed", True)], ()),
        (
            Status.FAILED,
            GateClass.NEW,
            "new: fails here; on base main (0123456789ab) the cell "
            "could not run (no environment for torchtitan@0123456789ab: "
            "uv failed), so nothing clears it",
        ),
    ),
    "another entry's error": (
        ([BOOM], [(None, False)], (entry(error="other"),)),
        (Status.FAILED, GateClass.NEW, "new: fails here, passes on base"),
    ),
}


@pytest.mark.parametrize("name", TABLE)
def test_a_failure_is_decided_once_from_its_result_entries_and_both_sides_runs(name):
    (own, base_runs, entries), (status, gate, verdict) = TABLE[name]
    _, d = case(own, base_runs, entries)
    assert (d.status, d.gate) == (status, gate), d
    assert d.verdict.startswith(verdict), d.verdict
    assert (d.entry is not None) == bool(entries and status == Status.XFAILED and gate == GateClass.KNOWN)


def test_without_a_base_a_new_failure_is_confirmed_or_flaky_and_pytest_fails_it():
    first = ran(BOOM)
    d = decide(first, [], confirm=confirm_record(first, [ran(BOOM)]))
    assert (d.status, d.gate, d.flaky, d.verdict) == (Status.FAILED, None, False, "new: failed in every one of 2 runs")
    d = decide(first, [], confirm=confirm_record(first, [ran(OTHER), ran(None)]))
    assert (d.status, d.flaky) == (Status.FAILED, True) and d.verdict.startswith("flaky, new: passed 1 of 3 runs")
    d = decide(first, [], confirm={"runs": 1, "culprit": "baseline b", "culprit_runs": 2, "culprit_passed": 0})
    assert (
        d.verdict == "not this cell's failure: baseline b failed in every one of its 2 runs; the cell itself ran once"
    )
    assert decide(ran(), []).status == Status.PASSED


def test_a_stored_record_is_decided_again_as_the_live_run_decided_it():
    """rejudge reads the runs the record kept: each class stands; an entry that applies now makes a failure known;
    a known failure whose entry is gone was never run on the base: it fails, with no class."""
    from pytest_simplefsdp.judge.known import KnownFailures

    first, d = case([BOOM], [(BOOM, False)])
    first.confirm = confirm_record(first, [ran(BOOM)])
    first.base = base_record([ran(BOOM)], BASE)
    first.gate, first.verdict, first.status = d.gate, d.verdict, d.status
    rec = first.record()
    none, known = KnownFailures("none.yaml", []), KnownFailures("kf.yaml", [entry()])
    again = rejudge(rec, none, {}, base=BASE.about())
    assert (again["status"], again["gate"], again["verdict"]) == (rec["status"], rec["gate"], rec["verdict"])
    now_known = rejudge(rec, known, {}, base=BASE.about())
    assert (now_known["status"], now_known["gate"]) == ("xfailed", "known")
    stored_known = dict(now_known, base=None, confirm=None)
    gone = rejudge(stored_known, none, {}, base=BASE.about())
    assert (gone["status"], gone["gate"]) == ("failed", None)


def rows(*outcomes):
    """History rows, newest first: None a pass, an error a failure with that error's signature."""
    from pytest_simplefsdp.judge.known import signature

    return [
        {
            "run": f"runs/{i}",
            "at": f"2026-12-0{9 - i}T00:00:00",
            "status": "failed" if e else "passed",
            "failure_class": "runtime" if e else None,
            "signature": signature(e) if e else None,
        }
        for i, e in enumerate(outcomes)
    ]


HISTORY = {  # name: earlier runs on the same versions, newest first -> flaky?
    "failed the same way, passed since": ((None, BOOM), True),
    "passed, failed the same way, passed since": ((None, None, BOOM, None), True),
    "only passes before: a first failure is new": ((None, None), False),
    "failed before, never passed since": ((BOOM, BOOM, None), False),
    "failed differently before, passed since": ((None, OTHER), False),
    "no history": ((), False),
}


@pytest.mark.parametrize("name", HISTORY)
def test_a_failure_its_history_shows_failing_and_passing_since_is_flaky_not_new(name):
    from pytest_simplefsdp.judge.history import record

    earlier, flaky = HISTORY[name]
    first = ran(BOOM)
    history = record(rows(*earlier), "h.sqlite") if earlier else None
    d = decide(first, [], confirm=confirm_record(first, [ran(BOOM)]), history=history)
    assert (d.status, d.flaky) == (Status.FAILED, flaky)
    if flaky:
        passed = sum(1 for e in earlier if e is None)
        assert d.verdict.startswith("flaky, new: failed the same way in run runs/") and d.verdict.endswith(
            f"passed {passed} of its last {len(earlier)} runs (history h.sqlite)"
        )
    else:
        assert d.verdict == "new: failed in every one of 2 runs"
    # under a PR gate the same history makes it flaky rather than new: it does not fail the gate
    d = decide(
        first, [], confirm=confirm_record(first, [ran(BOOM)]), base=base_record([], BASE), gated=True, history=history
    )
    assert d.gate == (GateClass.FLAKY if flaky else GateClass.NEW)
    # a stored record keeps the rows it was judged with: judged again, the same
    first.confirm, first.history = confirm_record(first, [ran(BOOM)]), history
    from pytest_simplefsdp.judge.known import KnownFailures

    again = rejudge(first.record(), KnownFailures("none.yaml", []), {})
    assert (again["flaky"], again["verdict"][:20]) == (
        flaky,
        decide(first, [], confirm=first.confirm, history=history).verdict[:20],
    )
