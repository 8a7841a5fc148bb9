"""Features (matrix key `features`): flags a cell adds beyond its axes, and later runs of the same cell that
resume its checkpoint; each later run must pass and must show it loaded the checkpoint."""

import json

from conftest import fake_matrix, marked

FEATURES = """\
features:
  plain: ["--delta 0.5"]
  resume: {flags: ["--checkpoint"], then: [["--steps 6"]]}
  forgetful: {flags: ["--checkpoint"], then: [["--steps 6", "--no-load"]]}
  crashing: {flags: ["--checkpoint"], then: [["--steps 6", "--mode fail", "--at-step 5"]]}
ids:
  ranks: {prefix: r}
  feature: {omit: none}
"""


def test_later_runs_resume_and_a_resume_that_loads_nothing_fails(run_matrix, pytester):
    text = fake_matrix().replace("ids:\n  ranks: {prefix: r}\n", FEATURES).replace(
        "  ranks: [2]\n", "  ranks: [2]\n  feature: [none, plain, resume, forgetful, crashing]\n", 1)
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=3, failed=2)
    cells = {c["id"]: c for c in json.loads(out.read_text())["runs"][0]["cells"]}
    resumed = cells["pass-r2-resume"]
    assert resumed["status"] == "passed" and sorted(resumed["losses"]) == ["1", "2", "3"]
    assert any(d.startswith("run 2 of 2 loaded the checkpoint and trained steps 4-6 (logs: ") and d.endswith("/run2)")
               for d in resumed["details"]), resumed["details"]
    forgot = cells["pass-r2-forgetful"]
    assert (forgot["failure_class"], forgot["error_line"]) == (
        "invalid_config", "run 2 of 2 did not load the checkpoint of run 1: its rank 0 log has no "
                          "'Finished loading the checkpoint'")
    crashed = cells["pass-r2-crashing"]
    assert (crashed["failure_class"], crashed["failing_rank"]) == ("runtime", 1)
    assert crashed["error_line"] == "run 2 of 2: RuntimeError: fake failure on purpose"
    assert cells["pass-r2-plain"]["status"] == "passed"  # a flag-only feature: one run
    assert not (pytester.path / "runs" / "fake" / "pass-r2-plain" / "run2").exists()
    assert not marked("pass-r2")


def test_a_feature_the_axis_names_must_be_defined(run_matrix):
    text = fake_matrix().replace("  ranks: [2]\n", "  ranks: [2]\n  feature: [none, missing]\n", 1)
    result = run_matrix(text)
    result.stderr.fnmatch_lines(["*fake.yaml:*: axis 'feature' names ?'missing'?, which `features` does not define*"])
