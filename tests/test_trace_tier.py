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


GPU = """\
  gpu:
    settings: {steps: 2}
    rules:
      - name: gpu-no-fail
        drop_if: mode == 'fail'
        reason: not on the GPU
"""


def test_with_a_gpu_visible_a_gpu_profile_traces_on_one_gpu_by_its_gpu_section(run_matrix, pytester, monkeypatch):
    """One visible GPU (as the plugin counts them: the fake rank needs none): each cell's simulated rank runs on the
    GPU with `trace.gpu`'s settings and rules, not the CPU's (PP stays: its rule is the CPU's), the dry run says
    where, and every report says these are one GPU's simulated ranks."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    dry = run_matrix(MATRIX + GPU, "--simplefsdp-tier=trace", "--simplefsdp-dry-run")
    dry.stdout.fnmatch_lines(["*fake.yaml[[]trace[]]::pass-dp8  [[]1 simulated rank of 8, on one GPU, timeout*"])
    out, md = pytester.path / "run.json", pytester.path / "status.md"
    result = run_matrix(
        MATRIX + GPU, "--simplefsdp-tier=trace", f"--simplefsdp-json={out}", f"--simplefsdp-status-md={md}", "-v"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*TRACE TIER, ONE GPU, SIMULATED RANKS: each cell ran as ONE simulated rank on one GPU*", "*gpu-no-fail 2*"]
    )
    run = run_doc(out)
    assert (run["meta"]["tier"], run["meta"]["device"]) == ("trace", "cuda")
    assert {c["id"]: sorted(c["losses"]) for c in run["cells"]} == {"pass-dp8": ["1", "2"], "pass-dp4-pp2": ["1", "2"]}
    assert "TRACE TIER, ONE GPU, SIMULATED RANKS" in md.read_text()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: the CPU's settings and rules, and its note
    cpu = run_matrix(MATRIX + GPU, "--simplefsdp-tier=trace", "--simplefsdp-dry-run")
    cpu.stdout.fnmatch_lines(
        ["*pass-dp8  [[]1 simulated rank of 8, on this CPU, timeout*", "*fake.yaml[[]trace[]]: 2 valid cells, 6 n/a"]
    )


@pytest.mark.parametrize(
    "gpu, message",
    [
        ("  gpu: [steps]\n", "*fake.yaml:27: `trace.gpu` must be a mapping with keys [[]'rules', 'settings'[]]*"),
        ("  gpu:\n    models: {}\n", "*fake.yaml:28: unknown trace.gpu key 'models'; allowed: rules, settings*"),
        ("  gpu:\n    settings: 3\n", "*fake.yaml:28: `trace.gpu.settings` must be a mapping (name: value), got 3"),
    ],
    ids=["not-a-mapping", "unknown-key", "settings-not-a-mapping"],
)
def test_a_bad_trace_gpu_section_names_its_file_line_and_value(run_matrix, gpu, message):
    result = run_matrix(MATRIX + gpu, "--simplefsdp-tier=trace", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
