"""One decision for a failure's class (judge.decision.decide), in-process on canned results: every combination of
its own runs, the base's runs and the known failures, as the live run and the report tool both reach it."""

import pytest

from pytest_simplefsdp.judge.decision import confirm_record, decide, rejudge
from pytest_simplefsdp.judge.gate import Base, base_record
from pytest_simplefsdp.judge.known import Entry, signature
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
        pass_rate=0.5 if kind == KnownKind.FLAKY else None,
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
        (
            Status.XFAILED,
            GateClass.FLAKY,
            "flaky: fails here, and on base main (0123456789ab) failed the same way and passed 1 of 2 runs",
        ),
    ),
    # issue 58, Why 3: the base passing once and failing once with another error clears nothing
    "a flaky base that fails differently": (
        ([BOOM], [(OTHER, False), (None, False)], ()),
        (
            Status.FAILED,
            GateClass.NEW,
            f"new: fails here; on base main (0123456789ab) passed 1 of 2 runs and failed otherwise differently; "
            f"here: {BOOM}; base: {OTHER}",
        ),
    ),
    "known": (([], None, (entry(),)), (Status.XFAILED, GateClass.KNOWN, "known failure known-one")),
    # issue 58, Why 2: a kind: flaky entry is proven by a run that passes, never by its word
    "known flaky that passed on a rerun": (
        ([None], None, (entry(KnownKind.FLAKY),)),
        (Status.XFAILED, GateClass.KNOWN, "known flaky known-one (https://github.com/pytorch/torchtitan/issues/1)"),
    ),
    "known flaky that failed every run": (
        ([BOOM, BOOM], [(None, False)], (entry(KnownKind.FLAKY),)),
        (
            Status.FAILED,
            GateClass.NEW,
            "new: fails here, passes on base main (0123456789ab) (1 of 1 runs); entry known-one "
            "(https://github.com/pytorch/torchtitan/issues/1) says it passes 50% of runs; it failed 3 of 3",
        ),
    ),
    "known flaky not rerun": (
        ([], [(None, False)], (entry(KnownKind.FLAKY),)),
        (Status.FAILED, GateClass.NEW, "new: fails here, passes on base main (0123456789ab) (1 of 1 runs); entry "),
    ),
    "known flaky failing every run, and so on the base": (
        ([BOOM, BOOM], [(BOOM, False), (BOOM, False)], (entry(KnownKind.FLAKY),)),
        (Status.XFAILED, GateClass.BROKEN_TRUNK, "broken trunk: fails on base main (0123456789ab) too"),
    ),
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


HISTORY = {  # name: earlier runs on the same versions, newest first -> a flaky past?
    "failed the same way, passed since": ((None, BOOM), True),
    "passed, failed the same way, passed since": ((None, None, BOOM, None), True),
    "only passes before: a first failure is new": ((None, None), False),
    "failed before, never passed since": ((BOOM, BOOM, None), False),
    "failed differently before, passed since": ((None, OTHER), False),
    "no history": ((), False),
}


@pytest.mark.parametrize("name", HISTORY)
def test_history_is_a_reason_for_more_runs_never_a_verdict(name):
    """Issue 58, Why 1: a failure that failed every one of its own runs is new whatever its history says (on the
    landed revision a flaky past made it flaky, and under a PR gate xfailed); the past is said in the verdict."""
    from pytest_simplefsdp.judge.decision import runs_to_pass
    from pytest_simplefsdp.judge.history import flaky_past, record

    earlier, past = HISTORY[name]
    first = ran(BOOM)
    history = record(rows(*earlier), "h.sqlite") if earlier else None
    assert bool(flaky_past(history, first.signature or signature(BOOM))) == past
    if past:  # it asks for runs until a pass is 99 % likely by the history's pass rate
        rate = flaky_past(history, signature(BOOM))[1]
        assert rate == sum(1 for e in earlier if e is None) / len(earlier) and runs_to_pass(rate) >= 3
    again = [ran(BOOM)] * 6
    d = decide(first, [], confirm=confirm_record(first, again), history=history)
    assert (d.status, d.flaky) == (Status.FAILED, False)
    assert d.verdict.startswith("new: failed in every one of 7 runs")
    assert ("its history shows it flaky: it failed the same way in run runs/" in d.verdict) == past
    d = decide(
        first, [], confirm=confirm_record(first, again), base=base_record([ran()], BASE), gated=True, history=history
    )
    assert (d.status, d.gate) == (Status.FAILED, GateClass.NEW)
    # one of its own runs passed: flaky, with or without a past
    d = decide(first, [], confirm=confirm_record(first, [ran(BOOM), ran()]), history=history)
    assert (d.status, d.flaky) == (Status.FAILED, True) and d.verdict.startswith("flaky, new: passed 1 of 3 runs")
    # a stored record keeps the rows it was judged with: judged again, the same
    first.confirm, first.history = confirm_record(first, again), history
    from pytest_simplefsdp.judge.known import KnownFailures

    again_rec = rejudge(first.record(), KnownFailures("none.yaml", []), {})
    assert (again_rec["flaky"], again_rec["status"]) == (False, "failed")


def test_runs_to_pass_makes_a_pass_99_percent_likely():
    from pytest_simplefsdp.judge.decision import MOST_RUNS, runs_to_pass

    assert [runs_to_pass(r) for r in (0.9, 0.8, 0.6, 0.5, 0.2, 0.0)] == [2, 3, 6, 7, MOST_RUNS, MOST_RUNS]
    for rate in (0.9, 0.8, 0.6, 0.5):
        n = runs_to_pass(rate)
        assert (1 - rate) ** n <= 0.01 < (1 - rate) ** (n - 1) or n == 2
