"""Features (matrix key `features`): flags a cell adds beyond its axes, and later runs of the same cell that
resume its checkpoint; each later run must pass and must show it loaded the checkpoint."""

from helpers import cells_of, fake_matrix, marked

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
    text = (
        fake_matrix()
        .replace("ids:\n  ranks: {prefix: r}\n", FEATURES)
        .replace("  ranks: [2]\n", "  ranks: [2]\n  feature: [none, plain, resume, forgetful, crashing]\n", 1)
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=3, failed=2)
    cells = cells_of(out)
    resumed = cells["pass-r2-resume"]
    assert resumed["status"] == "passed" and sorted(resumed["losses"]) == ["1", "2", "3"]
    assert any(
        d.startswith("run 2 of 2 loaded the checkpoint and trained steps 4-6 (logs: ") and d.endswith("/run2)")
        for d in resumed["details"]
    ), resumed["details"]
    forgot = cells["pass-r2-forgetful"]
    assert (forgot["failure_class"], forgot["error_line"]) == (
        "invalid_config",
        "run 2 of 2 did not load the checkpoint of run 1: its rank 0 log has no 'Finished loading the checkpoint'",
    )
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


STEP = (
    "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); "
    "p.write_text(sys.argv[2]) if sys.argv[2] != 'broken' else (_ for _ in ()).throw(RuntimeError('the precompile step broke'))"
)


def test_a_step_before_the_cell_runs_first_and_its_failure_is_the_cells(run_matrix, pytester):
    """`features.<name>.before: precompile`: one process writes what the cell's ranks then load (upstream's
    precompile tests); a failing step fails the cell with its own error, and the ranks never start."""
    artifact = "{dump_folder}/../precompile_artifact/model.bin"
    text = (
        fake_matrix(args=f', "--needs", "{artifact}"')
        .replace(
            "ids:\n  ranks: {prefix: r}\n",
            """\
features:
  precompile: {before: precompile}
  unprepared: ["--delta 0.5"]
ids:
  ranks: {prefix: r}
  feature: {omit: none}
""",
        )
        .replace("  ranks: [2]\n", "  ranks: [2]\n  feature: [precompile, unprepared]\n  artifact: [good, broken]\n", 1)
        .replace(
            "target:\n",
            f'target:\n  steps:\n    precompile: ["{{python}}", "-c", "{STEP}", "{artifact}", "{{artifact}}"]\n',
            1,
        )
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}", "--simplefsdp-dry-run")
    result.stdout.fnmatch_lines(
        [
            "*fake.yaml::pass-r2-precompile-good*",
            "  first, the precompile step ?1 process?: *-c *precompile_artifact/model.bin good*",
        ]
    )
    result = run_matrix(text, f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1, failed=3)
    cells = cells_of(out)
    good = cells["pass-r2-precompile-good"]
    assert good["status"] == "passed" and any(d.startswith("the precompile step passed first") for d in good["details"])
    folder = pytester.path / "runs" / "fake" / "pass-r2-precompile-good"
    assert (folder / "precompile" / "command.txt").exists() and (folder / "precompile_artifact" / "model.bin").exists()
    assert "loaded the precompiled artifact" in (folder / "rank1.log").read_text()
    broken = cells["pass-r2-precompile-broken"]
    assert (broken["failure_class"], broken["error_line"]) == (
        "runtime",
        "precompile step: RuntimeError: the precompile step broke",
    )
    assert not (pytester.path / "runs" / "fake" / "pass-r2-precompile-broken" / "rank0.log").exists()  # never started
    assert any("its logs: " in d and d.endswith("/precompile") for d in broken["details"])
    unprepared = cells["pass-r2-unprepared-good"]  # no step, no artifact: the ranks say so
    assert unprepared["error_line"].startswith("RuntimeError: no precompiled artifact at ")
    assert not marked("pass-r2")


def test_a_step_the_target_does_not_have_is_refused(run_matrix):
    text = (
        fake_matrix()
        .replace(
            "ids:\n  ranks: {prefix: r}\n",
            """\
features:
  precompile: {before: [precompile]}
ids:
  ranks: {prefix: r}
""",
        )
        .replace("  ranks: [2]\n", "  ranks: [2]\n  feature: [precompile]\n", 1)
    )
    result = run_matrix(text)
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        ["ERROR: *fake.yaml:*: features.precompile.before: target command has no step precompile (its steps: none)"]
    )


def test_virtual_local_rank_gives_every_worker_local_rank_0_and_its_own_gpu():
    """torchrun --virtual-local-rank, as the local and fork launchers reproduce it for a precompiled cell."""
    from pathlib import Path

    from pytest_simplefsdp.launch.procs import worker_vars
    from pytest_simplefsdp.launch.spec import LaunchSpec
    from pytest_simplefsdp.targets import RankCommand

    spec = LaunchSpec("c", RankCommand(["x"], virtual_local_rank=True), 4, Path("."), 10, 1, 1)
    base = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    got = [worker_vars(spec, r, base, "t") for r in range(4)]
    assert [(g["RANK"], g["LOCAL_RANK"], g["CUDA_VISIBLE_DEVICES"]) for g in got] == [
        ("0", "0", "4"),
        ("1", "0", "5"),
        ("2", "0", "6"),
        ("3", "0", "7"),
    ]
    plain = worker_vars(LaunchSpec("c", RankCommand(["x"]), 4, Path("."), 10, 1, 1), 2, base, "t")
    assert plain["LOCAL_RANK"] == "2" and "CUDA_VISIBLE_DEVICES" not in plain
