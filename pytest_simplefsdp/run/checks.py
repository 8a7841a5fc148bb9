"""What a green must show before it counts, whatever its baseline: that its label took effect (the evidence) and
that every optimizer step kept its exact invariants (judge.invariants). Numerics against a baseline come after
(baselines.py)."""

from __future__ import annotations

from ..judge import invariants
from ..kinds import FailureClass


def check_evidence(run, cell, spec, result):
    """A green must show that its label took effect; where the probe that shows it did not run, that is said."""
    evidence = run.target.evidence(cell, spec.log_dir)
    held = run.target.memory(cell, spec.log_dir)
    if held is not None:  # the bytes each rank holds are evidence of the layout too
        result.memory = held.record()
        evidence.append(held.evidence())
    result.evidence = [e.record() for e in evidence]
    blind = [e for e in evidence if not e.ok and e.infra]
    contradicted = [e for e in evidence if not e.ok and not e.infra]
    if blind:
        result.fail(FailureClass.INFRA, f"the evidence probe cannot show the label: {blind[0].line()}")
    elif contradicted:
        result.fail(FailureClass.INVALID_CONFIG, f"the run does not show its label: {contradicted[0].line()}")


def check_invariants(spec, result):
    """A green must keep the exact invariants of every optimizer step, baseline or not."""
    found = invariants.check(spec.log_dir, spec.nproc)
    result.invariants = found.record()
    if found.violation:
        result.fail(FailureClass.NUMERICS, f"optimizer-step invariant ({found.check}): {found.violation}")
