"""run.checks: the checks a green must pass after its launch, as one ordered list, on canned results (in-process,
nothing launched); and the one constructor of an infra result."""

from types import SimpleNamespace

import pytest

from pytest_simplefsdp.judge.evidence import Evidence
from pytest_simplefsdp.judge.results import CellResult
from pytest_simplefsdp.kinds import FailureClass, Status, Tier
from pytest_simplefsdp.run import checks
from pytest_simplefsdp.spec.cells import Cell

pytestmark = pytest.mark.inproc

CELL = Cell("llama3-dp2-eager", {"model": "llama3", "dp_shard": 2}, 2)


class Target:
    """The target's evidence and memory readers, returning canned evidence and counting their calls."""

    def __init__(self, evidence):
        self.canned, self.calls = evidence, []

    def evidence(self, cell, log_dir):
        self.calls.append("evidence")
        return list(self.canned)

    def memory(self, cell, log_dir):
        return None


def checked(tmp_path, evidence, losses=None, grad_norms=None, invariants=False, tier=Tier.REAL):
    target = Target(evidence)
    spec = SimpleNamespace(
        log_dir=tmp_path, nproc=2, command=SimpleNamespace(env={"SIMPLEFSDP_INVARIANTS": "1"} if invariants else {})
    )
    result = CellResult(
        CELL.id, dict(CELL.axes), losses=losses or {1: 10.8, 2: 9.9}, grad_norms=grad_norms or {1: 4.1, 2: 3.7}, world=2
    )
    checks.run_checks(SimpleNamespace(target=target, matrix=SimpleNamespace(tier=tier)), CELL, spec, result)
    return result, target.calls


SHOWN = Evidence("dp_shard=2", "split over 2 ranks", "split over 2 ranks", True)


def test_the_checks_run_in_order_and_the_first_failure_ends_them(tmp_path):
    assert [c.__name__ for c in checks.CHECKS] == ["check_trained", "check_evidence", "check_invariants"]
    green, calls = checked(tmp_path, [SHOWN])
    assert (green.status, green.failure_class, calls) == (Status.PASSED, None, ["evidence"])
    assert green.evidence == [SHOWN.record()] and green.invariants is None  # (its ranks recorded none)
    dead, calls = checked(tmp_path, [SHOWN], grad_norms={1: 4.1, 2: 0.0})
    assert (dead.failure_class, dead.error_line, calls) == (
        FailureClass.NUMERICS,
        "grad_norm is 0.0 at step 2: that step trained nothing",
        [],
    )
    nan, _ = checked(tmp_path, [SHOWN], losses={1: 10.8, 2: float("nan")})
    assert nan.error_line == "loss is nan at step 2"


def test_the_trace_tier_says_a_non_finite_loss_and_does_not_judge_it(tmp_path):
    """One simulated rank's collectives move no data (torch 2.11's fake process group leaves their outputs
    uninitialized: NaN losses on 0.2.2): the trace tier judges that the step ran, not what it computed."""
    traced, calls = checked(tmp_path, [SHOWN], losses={1: float("nan")}, tier=Tier.TRACE)
    assert (traced.status, calls) == (Status.PASSED, ["evidence"])
    assert traced.details == [
        "not judged in the trace tier: loss is nan at step 1 (the fake process group's collectives move no data)"
    ]


def test_evidence_that_contradicts_the_label_or_could_not_be_read(tmp_path):
    wrong = Evidence("dp_shard=2", "split over 2 ranks", "whole on every rank", False)
    contradicted, _ = checked(tmp_path, [SHOWN, wrong], invariants=True)
    assert (contradicted.failure_class, contradicted.error_line) == (
        FailureClass.INVALID_CONFIG,
        "the run does not show its label: dp_shard=2: expected split over 2 ranks, saw whole on every rank",
    )
    assert contradicted.invariants is None  # the list ended before the invariants were read
    blind, _ = checked(tmp_path, [wrong, Evidence("tp=2", "a probe record", "no record", False, infra=True)])
    assert blind.failure_class == FailureClass.INFRA  # a probe that did not run outranks a contradiction
    assert blind.error_line == "the evidence probe cannot show the label: tp=2: expected a probe record, saw no record"


def test_invariants_are_read_where_the_ranks_recorded_them(tmp_path):
    result, _ = checked(tmp_path, [SHOWN], invariants=True)  # asked for, but no rank wrote a record
    assert result.invariants is not None and result.status == Status.FAILED, result
    assert result.error_line.startswith("optimizer-step invariant (")


def test_an_infra_result_names_its_line_and_its_culprit():
    mutant = Cell(CELL.id, CELL.axes, 2, mutant="fsdp_partial")
    r = CellResult.infra(mutant, "baseline llama3-dp1-eager failed: RuntimeError: boom", culprit="baseline x")
    assert (r.status, r.failure_class, r.error_line, r.error_text) == (
        Status.FAILED,
        FailureClass.INFRA,
        "baseline llama3-dp1-eager failed: RuntimeError: boom",
        "baseline llama3-dp1-eager failed: RuntimeError: boom",
    )
    assert (r.culprit, r.mutant, r.world, r.axes, r.not_run) == ("baseline x", "fsdp_partial", 2, CELL.axes, False)
    assert CellResult.infra(CELL, "no environment", not_run=True).culprit is None
