"""The optimizer step's exact invariants (judge.invariants), on fake ranks that record them as the shim's training
probe does: each broken invariant fails its cell as numerics, naming the rank, the parameter and the step; a run
that keeps them all passes; the update norms they carry are compared with the baseline after step 1."""

import pytest

from helpers import NUMERICS, cells_of, fake_matrix

pytestmark = pytest.mark.fake

WITH_INVARIANTS = 'target:\n  env: {SIMPLEFSDP_INVARIANTS: "1"}\n'


def matrix(modes, extra=""):
    return fake_matrix(modes=modes, extra=extra).replace("target:\n", WITH_INVARIANTS, 1)


def test_each_broken_invariant_fails_its_cell_naming_rank_parameter_and_step(run_matrix, pytester):
    out = pytester.path / "run.json"
    result = run_matrix(
        matrix(["pass", "staleupdate", "replicadrift", "lrskew", "extrastep", "bigupdate"]), f"--simplefsdp-json={out}"
    )
    result.assert_outcomes(passed=2, failed=4)  # bigupdate keeps every invariant: only a baseline can tell
    cells = cells_of(out)
    lines = {cid.split("-")[0]: (c["failure_class"], c["error_line"], c["invariants"]) for cid, c in cells.items()}
    assert lines["pass"][0] is None and lines["pass"][2] == {
        "ranks": [0, 1],
        "steps": 3,
        "params": 12,
        "violation": None,
        "check": None,
    }
    assert lines["staleupdate"][:2] == (
        "numerics",
        "optimizer-step invariant (changed): rank 1: w did not change "
        "in the optimizer step of step 2 (its gradient there is nonzero, "
        "learning rate 0.001)",
    )
    assert lines["replicadrift"][:2] == (
        "numerics",
        "optimizer-step invariant (replicas): w: the copies on ranks 0 "
        "and 1 differ after the optimizer step of step 2 (a replica "
        "missed or diverged from an update)",
    )
    assert lines["lrskew"][:2] == (
        "numerics",
        "optimizer-step invariant (lr): the learning rate differs between "
        "ranks at step 2: [0.001] on ranks 0; [0.002] on ranks 1",
    )
    assert lines["extrastep"][:2] == (
        "numerics",
        "optimizer-step invariant (steps): rank 1 ran 3 optimizer steps "
        "by the end of step 2 (one per training step: 2)",
    )
    assert lines["bigupdate"][0] is None


def test_a_rank_without_records_is_named(run_matrix, pytester):
    """A rank whose probe recorded nothing while its peers did: the cell does not pass on the others' word."""
    out = pytester.path / "run.json"
    result = run_matrix(matrix(["norecord"]), f"--simplefsdp-json={out}")
    result.assert_outcomes(failed=1)
    cell = next(iter(cells_of(out).values()))
    assert cell["error_line"] == (
        "optimizer-step invariant (steps): the training probe recorded no optimizer step on ranks 1 (it did on ranks 0)"
    )


def test_update_norms_are_compared_with_the_baseline_after_step_one(run_matrix, pytester):
    """bigupdate keeps every invariant, but its rank's piece of `s` moved twice as far from step 2: the close lane's
    update tolerance catches it at step 2 by the update norm; its gradients and losses are the baseline's."""
    lanes = NUMERICS.replace("match: [{mode: perturb}, {mode: nan}]", "match: [{mode: perturb}, {mode: bigupdate}]")
    lanes = lanes.replace("      atol: 1.0e-5\n", "      atol: 1.0e-5\n      update_rtol: 1.0e-3\n", 1)
    out = pytester.path / "run.json"
    result = run_matrix(matrix(["pass", "bigupdate"], extra=lanes), f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1, failed=1)
    cell = cells_of(out)["bigupdate-r2"]
    assert cell["failure_class"] == "numerics" and cell["numerics"]["check"] == "update_norm"
    first = cell["numerics"]["params"]["first_difference"]
    assert (first["param"], first["step"], first["kind"]) == ("s", 2, "update_norm")
    # sqrt(0.25 + 1.0) against the baseline's sqrt(0.25 + 0.25)
    assert first["cell"] == pytest.approx(1.25**0.5) and first["baseline"] == pytest.approx(0.5**0.5)
    assert cell["error_line"].startswith("s: update norm 1.11803 vs 0.707107 of baseline pass-r2 at step 2")
