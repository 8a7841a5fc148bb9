"""The fixture API: an ordinary test around one matrix cell, run and judged as the matrix would."""

import json

from helpers import fake_matrix

TESTS = """
import pytest

@pytest.mark.simplefsdp_cell("pass-r2", matrix="fake.yaml")
def test_a_passing_cell(simplefsdp_cell):
    assert simplefsdp_cell.status == "passed" and sorted(simplefsdp_cell.losses) == [1, 2, 3]
    assert simplefsdp_cell.losses[3] < simplefsdp_cell.losses[1]

@pytest.mark.simplefsdp_cell("fail-r2", matrix="fake.yaml")
def test_a_failing_cell(simplefsdp_cell):
    assert (simplefsdp_cell.status, simplefsdp_cell.failure_class, simplefsdp_cell.failing_rank) == ("failed", "runtime", 1)
    assert simplefsdp_cell.error_line == "RuntimeError: fake failure on purpose"

@pytest.mark.simplefsdp_cell("fail-r2", matrix="fake.yaml", mutant="loss_shift")
def test_a_mutant(simplefsdp_cell):
    assert simplefsdp_cell.killed_by == "exit (runtime)"

@pytest.mark.simplefsdp_cell("typo-r2", matrix="fake.yaml")
def test_an_unknown_cell(simplefsdp_cell):
    pass

def test_an_ordinary_test_beside_them():
    pass
"""


def test_ordinary_tests_run_cells_through_the_fixture(pytester):
    (pytester.path / "fake.yaml").write_text(
        fake_matrix(modes=["pass", "fail"]).replace("target:\n", "target:\n  mutants: [loss_shift]\n")
    )
    pytester.makepyfile(test_cells=TESTS)
    runs = pytester.path / "runs"
    result = pytester.runpytest_subprocess("-v", "--simplefsdp-launcher=local", f"--simplefsdp-artifacts={runs}")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["*fake.yaml has no valid cell 'typo-r2'; its cells: pass-r2, fail-r2*"])
    records = [json.loads(x) for x in (runs / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records if r.get("type") == "cell"] == ["pass-r2", "fail-r2", "fail-r2[mutant-loss_shift]"]
    assert (runs / "fake" / "pass-r2" / "command.txt").exists()
