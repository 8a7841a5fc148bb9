"""What a green must show before it counts, in order, whatever its baseline: that it trained (the untrained step),
that its label took effect (the evidence), and that every optimizer step kept its exact invariants
(judge.invariants). Each check is a function of (run, cell, spec, result) that fails the result or leaves it green;
the first that fails ends the list (a run that did not train has no evidence worth reading). Numerics against a
baseline are the last check, after the cell's later runs, where its baseline's run is at hand (baselines.py)."""

from __future__ import annotations

from ..judge import invariants
from ..judge.numerics import untrained_step
from ..kinds import FailureClass, Status, Tier


def check_trained(run, cell, spec, result):
    """A green whose optimizer step changed nothing did not train (its losses stand still from step 1). The trace
    tier's collectives move no data (the fake process group; before torch 2.13 it leaves their outputs
    uninitialized), so there a loss or grad norm that is not finite is said, not judged."""
    line = untrained_step(result)
    if line and run.matrix.tier == Tier.TRACE:
        result.details.append(
            f"not judged in the trace tier: {line} (the fake process group's collectives move no data)"
        )
    elif line:
        result.fail(FailureClass.NUMERICS, line)


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


def check_invariants(run, cell, spec, result):
    """A green must keep the exact invariants of every optimizer step, where its ranks recorded them."""
    if spec.command.env.get("SIMPLEFSDP_INVARIANTS") != "1":
        return
    found = invariants.check(spec.log_dir, spec.nproc)
    result.invariants = found.record()
    if found.violation:
        result.fail(FailureClass.NUMERICS, f"optimizer-step invariant ({found.check}): {found.violation}")


CHECKS = (check_trained, check_evidence, check_invariants)


def run_checks(run, cell, spec, result, checks=CHECKS):
    """The checks in order on a green result; the first that fails it ends them."""
    for check in checks:
        if result.status != Status.PASSED:
            return
        check(run, cell, spec, result)
