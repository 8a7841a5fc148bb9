"""The trace tier: one simulated rank per cell; what it cannot run is n/a, never passed."""

import textwrap

import pytest

from helpers import FAKE_RANK, run_doc

MATRIX = textwrap.dedent(f"""\
    profile: fake8
    target:
      command: ["{{python}}", "{FAKE_RANK}", "--mode", "{{mode}}", "--rank", "0", "--at-step", "1", "--dump", "{{dump_folder}}",
                "--steps", "{{steps}}"]
      env: {{SIMULATED_WORLD: "{{nproc}}"}}
    device: cuda
    world_sizes: [8]
    degrees: [dp, pp]
    settings: {{steps: 3}}
    axes:
      mode: [pass, fail]
      dp: [4, 8]
      pp: [1, 2]
    rules:
      - name: world-size
        drop_if: world not in world_sizes
        reason: "{{world}} ranks"
    ids:
      dp: {{prefix: dp}}
      pp: {{prefix: pp, omit: 1}}
    trace:
      settings: {{steps: 1}}
      rules:
        - name: trace-no-pp
          drop_if: pp > 1
          reason: PP cannot run on a fake process group
    """)


def test_trace_tier_runs_one_rank_per_cell_and_pp_is_na(run_matrix, pytester):
    out = pytester.path / "run.json"
    result = run_matrix(MATRIX, "--simplefsdp-tier=trace", f"--simplefsdp-json={out}", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*fake.yaml[[]trace[]]::pass-dp8 PASSED*",
            "*fake.yaml[[]trace[]]::fail-dp8 FAILED*",
            "*TRACE TIER: each cell ran as ONE simulated rank*",
            "*n/a: 6 cells dropped by rule: world-size 4, trace-no-pp 2*",
        ]
    )
    run = run_doc(out)
    assert run["meta"]["tier"] == "trace"
    assert {c["id"]: c["status"] for c in run["cells"]} == {"pass-dp8": "passed", "fail-dp8": "failed"}
    assert {d["id"]: d["rule"] for d in run["dropped"] if d["rule"] == "trace-no-pp"} == {
        "pass-dp4-pp2": "trace-no-pp",
        "fail-dp4-pp2": "trace-no-pp",
    }
    cell = next(c for c in run["cells"] if c["id"] == "fail-dp8")
    assert cell["losses"] == {} and list(cell["rank_logs"]) == ["0"]  # one process, failed in its first step


def test_trace_tier_needs_a_trace_section(run_matrix):
    result = run_matrix(MATRIX.split("trace:")[0], "--simplefsdp-tier=trace")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fake.yaml: tier 'trace' needs a `trace` section in the matrix file*"])


def test_known_failure_can_name_the_tier(run_matrix, pytester):
    kf = pytester.path / "kf.yaml"
    kf.write_text(
        textwrap.dedent("""\
        - id: fails-when-traced
          when: {mode: fail, tier: trace}
          error: fake failure
          kind: xfail
          link: https://github.com/pytorch/torchtitan/issues/3780
          reason: seen in the trace tier
        """)
    )
    result = run_matrix(MATRIX, "--simplefsdp-tier=trace", f"--simplefsdp-known-failures={kf}")
    result.assert_outcomes(passed=1, xfailed=1)
