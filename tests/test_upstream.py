"""Upstream's own suite as a source: the loader on a small fake definitions file and on the installed
torchtitan's real one, the mapping to our axes, and the coverage of our profiles."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_simplefsdp.report import coverage
from pytest_simplefsdp.spec import upstream
from pytest_simplefsdp.spec.matrix import load_matrix

FAKE = Path(__file__).parent / "data" / "upstream_fake" / "integration_tests.py"
FAKE_CONFIGS = FAKE.with_name("integration_tests_configs.py")


def test_the_loader_runs_upstreams_builders_and_reads_why_a_test_is_disabled():
    tests = {t.name: t for t in upstream.load_file(FAKE)}
    assert list(tests) == ["jit_1d_auto_bucketing", "aot_fx_trace_fsdp_tp", "checkpoint_resume", "moe_ep2", "moe_ep4"]
    jit = tests["jit_1d_auto_bucketing"]
    assert (
        jit.disabled
        and jit.ngpu == 4
        and jit.flags
        == (
            "--module",
            "graph_trainer.llama3",
            "--config",
            "graph_trainer_llama3_debugmodel",
            "--compile.mode",
            "jit",
            "--compile.passes=auto_bucketing",
        )
    )
    assert "partitioner regression" in jit.note and jit.links == ("https://github.com/pytorch/torchtitan/issues/2149",)
    assert jit.where == f"{FAKE}:15"  # the line of its OverrideDefinitions(
    assert len(tests["checkpoint_resume"].runs) == 2 and tests["checkpoint_resume"].ngpu == 2
    # a name built by an f-string in a comprehension: the comment inside the call still reaches each variant
    assert not tests["moe_ep2"].disabled and tests["moe_ep4"].disabled
    assert tests["moe_ep4"].links == (
        "https://github.com/pytorch/torchtitan/issues/4052",
        "https://github.com/pytorch/pytorch/issues/170369",
    )
    assert "tests" not in sys.modules or not hasattr(sys.modules["tests"], "integration_tests")  # stand-in removed


def test_a_test_in_the_matrixs_axes():
    tests = {t.name: t for t in upstream.load_file(FAKE)}
    c = upstream.configuration(tests["aot_fx_trace_fsdp_tp"])
    assert (c.axes, c.world, c.features) == (
        {"model": "llama3", "compile": "aot_fx_trace", "dp_shard": 2, "tp": 2},
        4,
        {},
    )
    c = upstream.configuration(tests["jit_1d_auto_bucketing"])
    assert c.axes == {"model": "llama3", "compile": "jit", "dp_shard": 4} and c.features == {
        "compile.passes": "auto_bucketing"
    }
    c = upstream.configuration(tests["moe_ep2"])  # dp_shard -1: every rank the other degrees leave
    assert c.axes == {"model": "deepseek_v3", "compile": "aot_fx_trace", "ep": 2, "dp_shard": 8}
    assert upstream.configuration(tests["checkpoint_resume"]).features == {"checkpoint.enable": True, "runs": 2}


def test_a_test_in_the_configs_form_reads_as_the_flags_its_configuration_sets():
    """Upstream's `configs` form (#4177): each run a full configuration, selected as upstream's runner does (its
    function's module and name); what it sets on the matrix's axes read from the config it returns, so the test
    has the same axes (and runs the same layout on a trace-tier twin) as its override_args spelling."""
    tests = {t.name: t for t in upstream.load_file(FAKE_CONFIGS)}
    assert list(tests) == ["aot_fx_trace_fsdp_tp", "jit_fsdp_inductor", "eager_8b", "moe_checkpoint_relayout", "jit_1d"]
    fsdp_tp = tests["aot_fx_trace_fsdp_tp"]
    module = fsdp_tp.flags[1]
    assert fsdp_tp.flags[:4] == ("--module", module, "--config", "llama3_debugmodel_fsdp2_tp2")
    assert module.startswith("simplefsdp_upstream_")  # the function's own module, as upstream's MODULE= names it
    c = upstream.configuration(fsdp_tp)
    assert (c.axes, c.world, c.features) == (
        {
            "model": "llama3",
            "compile": "aot_fx_trace",
            "dp_shard": 2,
            "tp": 2,
            "dp_replicate": 1,
            "ep": 1,
            "cp": 1,
            "pp": 1,
            "backend": "aot_eager",
            "memory_policy": "default",
        },
        4,
        {},
    )
    assert upstream.normal(c.axes) == upstream.normal(upstream.configuration(upstream.load_file(FAKE)[1]).axes)
    jit = tests["jit_fsdp_inductor"]
    assert jit.disabled and jit.links == ("https://github.com/pytorch/torchtitan/issues/2149",)
    assert upstream.configuration(jit).axes["backend"] == "inductor"
    assert "memory_policy" not in upstream.configuration(jit).axes  # jit runs no graph policy: not read
    eager = upstream.configuration(tests["eager_8b"])
    assert eager.axes["compile"] == "eager" and eager.axes["dp_shard"] == 8 and eager.features == {"config": "8B"}
    relayout = tests["moe_checkpoint_relayout"]
    c = upstream.configuration(relayout)
    assert c.axes["model"] == "deepseek_v3" and (c.axes["ep"], c.axes["pp"], c.axes["pp_schedule"]) == (
        2,
        2,
        "Interleaved1F1B",
    )
    assert c.axes["dp_shard"] == 4  # -1: the ranks PP leaves
    assert relayout.runs[1][-3:] == ("--checkpoint.enable", "--training.steps", "20")  # its own args on top
    assert c.features == {
        "checkpoint.enable": True,
        "runs": 2,
        "run2.config": "deepseek_v3_debugmodel_ep4",
        "run2.parallelism.expert_parallel_degree": "4",
        "run2.parallelism.pipeline_parallel_degree": "1",
    }
    assert upstream.configuration(tests["jit_1d"]).axes == {"model": "llama3", "compile": "jit", "dp_shard": 4}


MATRIX = """\
profile: mini
target: titan03
device: cuda
world_sizes: [4]
degrees: [dp_shard, tp]
models:
  llama3: {module: graph_trainer.llama3, config: graph_trainer_llama3_debugmodel}
features:
  auto_bucketing: ["--compile.passes=auto_bucketing"]
axes:
  model: [llama3]
  dp_shard: [2, 4]
  tp: [1, 2]
  compile: [aot_fx_trace, jit]
  memory_policy: [none, default]
  feature: [none, auto_bucketing]
rules:
  - {name: world, drop_if: world not in world_sizes, reason: "{world} ranks"}
  - {name: graph-policy, drop_if: "(compile != 'aot_fx_trace') != (memory_policy == 'none')", reason: jit runs none}
ids:
  dp_shard: {prefix: dp}
  tp: {prefix: tp, omit: 1}
  memory_policy: {prefix: mp_, omit: none}
  feature: {omit: none}
"""


def test_coverage_names_the_cell_or_what_is_missing(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(MATRIX)
    cov = coverage.coverage(upstream.load_file(FAKE), coverage.candidates([load_matrix(path)]))
    rows = {r.test.name: r for r in cov["tests"]}
    assert rows["aot_fx_trace_fsdp_tp"].status == "covered"
    assert rows["aot_fx_trace_fsdp_tp"].cells == [
        "mini::llama3-dp2-tp2-aot_fx_trace-mp_default",
        "mini::llama3-dp2-tp2-aot_fx_trace-mp_default-auto_bucketing",
    ]
    # torchtitan's jit applies no memory policy: upstream's jit test is the cell without one
    assert rows["jit_1d_auto_bucketing"].cells == ["mini::llama3-dp4-jit-auto_bucketing"]
    # a layout the profile has but drops names the rule; a world no profile has says so
    assert (
        rows["checkpoint_resume"].status == "none"
        and rows["checkpoint_resume"].reason == "mini rules this layout out: rule world: 2 ranks"
    )
    assert rows["moe_ep2"].reason == "no profile has a 8-rank world"
    assert cov["totals"] == {"covered": 2, "partly": 0, "none": 3}
    assert "mini::llama3-dp4-aot_fx_trace-mp_default" in cov["ours_only"]
    path.write_text(MATRIX.replace("  feature: [none, auto_bucketing]", "  feature: [none]"))
    cov = coverage.coverage(upstream.load_file(FAKE), coverage.candidates([load_matrix(path)]))
    row = next(r for r in cov["tests"] if r.test.name == "jit_1d_auto_bucketing")
    assert (row.status, row.reason) == ("partly", "same layout; not set by any: compile.passes")


def test_the_installed_torchtitans_suite_loads_and_our_profiles_cover_it():
    """The real file of the installed generation: its tests load, each maps to axes, and the report runs."""
    try:
        tests = upstream.load()
    except LookupError as e:
        pytest.skip(str(e))
    assert len(tests) >= 10 and len({t.name for t in tests}) == len(tests)
    assert all(upstream.configuration(t).world == t.ngpu for t in tests)
    assert any(t.disabled and t.note for t in tests)
    out = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report.coverage", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    doc = json.loads(out)
    assert sum(doc["totals"].values()) == len(tests) and doc["totals"]["covered"] >= 0.85 * len(tests)


SOURCE = """\
profile: upstream
target: titan03
source: upstream
device: cuda
world_sizes: [2, 4, 8]
settings: {steps: 5, seq_len: 512, local_batch_size: 2}
models:
  llama3: {moe: false}
  deepseek_v3: {moe: true}
rules:
  - {name: no-jit, drop_if: compile == 'jit', reason: jit is off}
"""


def test_source_upstream_makes_one_cell_per_upstream_test(tmp_path, monkeypatch):
    from pytest_simplefsdp.spec.cells import expand
    from pytest_simplefsdp.targets import make_target

    monkeypatch.setattr(upstream, "load", lambda gen=None, root=None: upstream.load_file(FAKE))
    path = tmp_path / "upstream.yaml"
    path.write_text(SOURCE)
    matrix = upstream.with_source(load_matrix(path))  # (validating the file reads no test: running it does)
    cells, dropped = expand(matrix)
    assert [(c.id, c.world) for c in cells] == [
        ("aot_fx_trace_fsdp_tp", 4),
        ("checkpoint_resume", 2),
        ("moe_ep2", 8),
        ("moe_ep4", 8),
    ]
    assert [(d.id, d.rule) for d in dropped] == [("jit_1d_auto_bucketing", "no-jit")]  # rules see what it configures
    cell = cells[0]
    assert cell.axes["upstream"] == "aot_fx_trace_fsdp_tp" and (cell.axes["tp"], cell.axes["dp_shard"]) == (2, 2)
    assert cells[3].axes["disabled"] is True and cells[1].axes["runs"] == 2
    target = make_target(matrix, tmp_path)
    argv = target.command(cell, dump_folder=tmp_path / "dump").argv
    words = " ".join(argv)
    assert "--module graph_trainer.llama3 --config graph_trainer_llama3_debugmodel" in words
    assert "--parallelism.tensor_parallel_degree 2" in words and "--compile.mode aot_fx_trace" in words
    assert "--training.steps 5" in words and f"--dump_folder {tmp_path / 'dump'}" in words
    resume = target.command(cells[1], dump_folder=tmp_path / "dump", run=1).argv  # its second run: upstream's steps
    assert target.runs(cells[1]) == 2 and resume[resume.index("--training.steps") + 1] == "20"
    path.write_text(SOURCE + "axes:\n  model: [llama3]\n")
    with pytest.raises(Exception, match="a matrix with `source: upstream` takes its cells from upstream; it has no"):
        load_matrix(path)
    # a suite that is not installed here is SourceUnavailable (shipped profiles of it are skipped); a file
    # with a wrong target is broken, whatever it says about upstream
    from pytest_simplefsdp.spec.matrix import MatrixError, SourceUnavailable

    def missing(gen=None, root=None):
        raise LookupError("torchtitan 0.3's graph_trainer tests are not installed")

    monkeypatch.setattr(upstream, "load", missing)
    path.write_text(SOURCE)
    with pytest.raises(
        SourceUnavailable, match=r"upstream.yaml:3: source upstream \(torchtitan 0.3\): .*not installed"
    ):
        upstream.with_source(load_matrix(path))
    path.write_text(SOURCE.replace("target: titan03", "target: titan04"))
    with pytest.raises(MatrixError, match="source upstream needs target titan03 or titan02") as bad:
        load_matrix(path)
    assert not isinstance(bad.value, SourceUnavailable)


def test_the_shipped_upstream_profile_lists_the_installed_suite(pytester):
    """`--simplefsdp-profile=upstream` (0.3) or titan02-upstream (0.2): one cell per installed upstream test."""
    try:
        tests = upstream.load()
    except LookupError as e:
        pytest.skip(str(e))
    profile = "titan02-upstream" if upstream.generation() == "0.2" else "upstream"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", f"--simplefsdp-profile={profile}", "--simplefsdp-dry-run", "--co", "-q"
    )
    ids = [
        line.rsplit("::", 1)[1]
        for line in result.stdout.lines
        if f"{profile}.yaml::" in line and " ranks, timeout " not in line
    ]  # (not the dry run's commands)
    from pytest_simplefsdp.spec.cells import value_id

    dropped_here = {"upstream": 0, "titan02-upstream": 1}[profile]  # (the model-less 0.2 test)
    assert len(ids) == len(tests) - dropped_here and set(ids) <= {value_id(t.name) for t in tests}


def test_upstreams_precompile_tests_are_covered_by_cells_that_precompile_first(pytester, monkeypatch):
    """0.3's run_precompile_tests.py: each test is a cell of h100x8 whose precompile step (precompile_main, one
    process) runs before its ranks, which load the artifact as torchrun --virtual-local-rank workers."""
    try:
        tests = [t for t in upstream.load() if t.kind == "precompile"]
    except LookupError as e:
        pytest.skip(str(e))
    if not tests:
        pytest.skip("the installed torchtitan has no precompile tests (0.2)")
    out = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report.coverage", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {r["name"]: r for r in json.loads(out)["tests"]}
    assert {t.name: rows[t.name]["status"] for t in tests} == {t.name: "covered" for t in tests}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", "--simplefsdp-profile=h100x8", "--simplefsdp-dry-run", "-k", "precompile"
    )
    result.stdout.fnmatch_lines(
        [
            "*h100x8.yaml::llama3-dp4-tp2-aot_fx_trace-mp_default-precompile  ?8 ranks*",
            "  first, the precompile step ?1 process?: *-m torchtitan.experiments.graph_trainer.precompile_main "
            "*--config graph_trainer_llama3_debugmodel_sdpa *--compile.precompile_artifact_dir *precompile_artifact*",
            "*--nproc-per-node=8 * --virtual-local-rank -m torchtitan.train *--compile.precompile_artifact_dir "
            "*precompile_artifact*",
        ]
    )
