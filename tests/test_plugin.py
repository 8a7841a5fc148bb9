"""The plugin end to end on fake targets: outcomes, ids, selection, dry run, stored results."""

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import GIT, fake_matrix, marked, run_doc


def test_without_the_flag_nothing_changes(pytester):
    pytester.makepyfile("def test_one(): pass")
    result = pytester.runpytest_subprocess("-v")
    result.assert_outcomes(passed=1)
    assert "simplefsdp" not in result.stdout.str().replace("plugins:", "").split("simplefsdp-")[0]
    result.stdout.no_fnmatch_line("*composability*")


def test_help_lists_options_in_one_group(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(
        [
            "*SimpleFSDP composability matrix*",
            "*--simplefsdp-matrix*",
            "*--simplefsdp-profile*",
            "*--simplefsdp-dry-run*",
            "*--simplefsdp-json*",
            "*simplefsdp_timeout*",
        ]
    )


def test_pass_and_fail(run_matrix, tmp_path):
    out = tmp_path / "run.json"
    result = run_matrix(fake_matrix(modes=["pass", "fail"]), "-v", f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*fake.yaml::pass-r2 PASSED*",
            "*fake.yaml::fail-r2 FAILED*",
            "*fail-r2: [[]runtime[]] RuntimeError: fake failure on purpose",
            "*first failing rank: 1*",
            "  rerun: pytest --simplefsdp-matrix fake.yaml::fail-r2",
            "  the ranks' command: *fail-r2/command.txt",
            "*simplefsdp composability*",
        ]
    )
    doc = json.loads(out.read_text())
    cells = {c["id"]: c for c in doc["runs"][0]["cells"]}
    assert cells["pass-r2"]["status"] == "passed"
    assert cells["pass-r2"]["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    bad = cells["fail-r2"]
    assert (bad["status"], bad["failure_class"], bad["failing_rank"]) == ("failed", "runtime", 1)
    assert bad["error_line"] == "RuntimeError: fake failure on purpose"
    assert bad["axes"] == {"mode": "fail", "ranks": 2} and bad["wall"] > 0
    assert Path(bad["log_dir"], "rank1.log").is_file()
    assert not marked("fail-r2")


def test_table_is_rendered_again_from_stored_results(run_matrix, pytester):
    result = run_matrix(fake_matrix(modes=["pass", "fail"]))
    jsonl = pytester.path / "runs" / "results.jsonl"
    assert jsonl.exists()
    again = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report", str(jsonl)], capture_output=True, text=True, check=True
    ).stdout
    table = result.stdout.str().split("simplefsdp composability")[1]
    for line in again.splitlines()[1:4]:
        assert line in table


@pytest.mark.parametrize(
    "mode, cls, line",
    [
        ("segv", "crash", "rank 1 killed by SIGSEGV"),
        ("kill", "crash", "rank 1 killed by SIGKILL"),
        ("exit3", "runtime", "exit code 3: *"),
        ("noresult", "no_result", "every rank exited 0 but 0 of 3 steps logged a loss"),
        ("nan", "numerics", "loss is nan at step 2"),
        # exit 0, losses logged and falling: only the grad norm shows the step trained nothing
        ("zerograd", "numerics", "grad_norm is 0.0 at step 2: that step trained nothing"),
    ],
)
def test_faults_are_classified(run_matrix, mode, cls, line):
    result = run_matrix(fake_matrix(modes=[mode], timeout=60))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{mode}-r2: [[]{cls}[]] {line}"])
    assert not marked(f"{mode}-r2")


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_hang_is_killed_with_stacks_and_stuck_rank(run_matrix, pytester, launcher):
    result = run_matrix(
        fake_matrix(modes=["hang"], ranks=[3], timeout=4 if launcher == "local" else 20), launcher=launcher
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hang-r3: [[]hang[]] timed out after * s; ranks still running: 0, 1, 2*"])
    cell = pytester.path / "runs" / "fake" / "hang-r3"  # rank 1's log, as each launcher names it
    log = "".join(p.read_text() for p in [*cell.glob("rank1.log"), *cell.glob("torchrun/*/attempt_*/1/std*.log")])
    assert "Current thread" in log or "Thread 0x" in log  # faulthandler's dump
    assert "time.sleep(3600)" in log or "in main" in log
    assert not marked("hang-r3")


def test_leftover_process_fails_the_cell(run_matrix):
    result = run_matrix(fake_matrix(modes=["orphan"]))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*orphan-r2: [[]infra[]] 1 process(es) outlived their rank and were killed*"])
    assert not marked("orphan-r2")


def test_dry_run_prints_commands_and_launches_nothing(run_matrix, pytester):
    """One line per job and one command as an example (every rank's environment and argv of 69 cells was 400 KB);
    every command under -v."""
    text = fake_matrix(modes=["pass", "hang"], ranks=[2, 4])
    result = run_matrix(text, "--simplefsdp-dry-run")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp dry run: cells*",
            "fake.yaml::pass-r2  [[]2 ranks, timeout 30 s[]]",
            "fake.yaml::pass-r4  [[]4 ranks, timeout 30 s[]]",
            "the command of pass-r2, as each job's is made*",
            "*RANK=1 LOCAL_RANK=1 WORLD_SIZE=2*fake_rank.py --mode pass*",
        ]
    )
    assert "--mode hang" not in result.stdout.str() and "WORLD_SIZE=4" not in result.stdout.str()
    verbose = run_matrix(text, "--simplefsdp-dry-run", "-v")
    verbose.stdout.fnmatch_lines(
        [
            "*simplefsdp dry run: commands*",
            "fake.yaml::pass-r4  [[]4 ranks, timeout 30 s[]]",
            "*RANK=3 LOCAL_RANK=3 WORLD_SIZE=4*fake_rank.py --mode pass*",
        ]
    )
    assert "--mode hang" in verbose.stdout.str()
    assert not (pytester.path / "runs").exists()


def test_k_and_m_select_by_id_and_tier(run_matrix):
    text = fake_matrix(modes=["pass", "fail"], ranks=[2, 3], extra="smoke:\n  - {mode: pass, ranks: 2}\n")
    result = run_matrix(text, "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        ["fake.yaml::pass-r2", "fake.yaml::pass-r3", "fake.yaml::fail-r2", "fake.yaml::fail-r3"]
    )
    run_matrix(text, "-k", "pass-r3").assert_outcomes(passed=1)
    run_matrix(text, "-m", "smoke").assert_outcomes(passed=1)


def test_last_failed_reruns_only_the_failed_cell(run_matrix):
    text = fake_matrix(modes=["pass", "fail"])
    run_matrix(text).assert_outcomes(passed=1, failed=1)
    result = run_matrix(text, "--lf", "-v")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fake.yaml::fail-r2 FAILED*"])


def test_junitxml_carries_axes_and_class(run_matrix, pytester):
    xml = pytester.path / "junit.xml"
    run_matrix(fake_matrix(modes=["pass", "fail"]), f"--junitxml={xml}")
    cases = {c.get("name"): c for c in ET.parse(xml).getroot().iter("testcase")}
    assert set(cases) == {"pass-r2", "fail-r2"}
    props = {p.get("name"): p.get("value") for p in cases["fail-r2"].iter("property")}
    assert json.loads(props["axes"]) == {"mode": "fail", "ranks": 2}
    assert props["failure_class"] == "runtime"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--simplefsdp-profile=nope"], "*unknown profile 'nope'; known: auto, all, *cpu*h100x8*"),
        (["--simplefsdp-timeout=soon"], "*--simplefsdp-timeout: not a number: 'soon'*"),
        (["--simplefsdp-timeout=inf"], "*--simplefsdp-timeout must be a positive finite number, got inf*"),
        (["--simplefsdp-log-limit=0"], "*--simplefsdp-log-limit must be a positive finite number, got 0*"),
        (["--simplefsdp-launcher=mpirun"], "*unknown launcher 'mpirun'; built in: auto, torchrun, local, fork, slurm*"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, message):
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_matrix_file_is_a_usage_error_naming_the_line(run_matrix):
    text = fake_matrix().replace("  mode: ['pass']", "  mode: ['pass'\n")
    result = run_matrix(text)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fake.yaml:1[0-9]: not valid YAML*"])


def test_unknown_placeholder_in_command(run_matrix):
    result = run_matrix(fake_matrix().replace("{steps}", "{stpes}"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fake.yaml:2: target.command uses unknown placeholder {stpes}*"])


def test_torchrun_launcher_names_the_first_failing_rank(run_matrix):
    result = run_matrix(fake_matrix(modes=["pass", "fail", "segv"], timeout=120), launcher="torchrun")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*fail-r2: [[]runtime[]] RuntimeError: fake failure on purpose*",
            "*first failing rank: 1*",
            "*segv-r2: [[]crash[]] rank 1 killed by SIGSEGV*",
            "*the ranks' command: *segv-r2/command.txt",
        ]
    )
    command = next(line for line in result.stdout.lines if "the ranks' command: " in line).split(": ", 1)[1]
    assert "torchrun --nproc-per-node=2" in open(command).read() and "--no-python" in open(command).read()
    assert not marked("fail-r2") and not marked("segv-r2") and not marked("pass-r2")


def test_a_cell_that_logged_no_step_never_passes(run_matrix):
    """`/bin/true` exits 0 on every rank; without settings.steps there is no count to miss, and still no pass."""
    text = textwrap.dedent("""\
        profile: fake
        target: {command: ["/bin/true"]}
        device: cpu
        world_sizes: [2]
        degrees: [ranks]
        timeout: 30
        axes:
          mode: [quiet]
          ranks: [2]
        ids:
          ranks: {prefix: r}
        """)
    result = run_matrix(text)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*quiet-r2: [[]no_result[]] every rank exited 0 but no step logged a loss*"])
    assert not marked("quiet-r2")


OPTIONS_CACHE = __import__("pytest_simplefsdp.paths").paths.cache_root()  # read before pytester's HOME


def shipped_cells(name):
    from pytest_simplefsdp.paths import MATRIX_DIR
    from pytest_simplefsdp.spec.cells import expand
    from pytest_simplefsdp.spec.matrix import load_matrix

    return [c.id for c in expand(load_matrix(MATRIX_DIR / f"{name}.yaml"))[0]]


@pytest.mark.parametrize(
    "profiles, names",
    [
        ("cpu,h100x8", ["cpu", "h100x8"]),
        ("all", ["cpu", "h100x4", "h100x8", "titan02-cpu", "titan02-h100x4", "titan02-h100x8"]),
    ],
    ids=["a,b", "all"],
)
def test_several_profiles_in_one_run(pytester, monkeypatch, profiles, names):
    # in process, with the user's options cache: a subprocess's PYTHONPATH (pytester's folder first) is part of
    # the cache key, so every shipped config would be probed again
    monkeypatch.setenv("XDG_CACHE_HOME", str(OPTIONS_CACHE))
    result = pytester.runpytest_inprocess(
        "--simplefsdp-matrix", f"--simplefsdp-profile={profiles}", "--simplefsdp-dry-run", "--co", "-q"
    )
    collected = [
        line
        for line in result.stdout.lines
        if "::" in line and "[" not in line.split("::")[0] and ", timeout " not in line
    ]
    want = [f"{n}.yaml::{cid}" for n in names for cid in shipped_cells(n)]
    assert [line.rsplit("/", 1)[-1] for line in collected] == want


def test_a_group_is_a_keyword(run_matrix):
    text = fake_matrix(
        modes=["pass", "perturb", "nan"], extra="groups:\n  mine:\n    - {mode: perturb}\n    - {mode: nan}\n"
    )
    result = run_matrix(text, "-k", "mine", "--co", "-q")
    result.stdout.fnmatch_lines(["fake.yaml::perturb-r2", "fake.yaml::nan-r2", "*2/3 tests collected (1 deselected)*"])


def test_report_tool_renders_json_from_results_jsonl(run_matrix, pytester):
    out = pytester.path / "run.json"
    run_matrix(fake_matrix(modes=["pass", "fail"]), f"--simplefsdp-json={out}")
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_simplefsdp.report",
            str(pytester.path / "runs" / "results.jsonl"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stored, rendered = run_doc(out), json.loads(again)["runs"][0]
    assert (
        [(c["id"], c["status"], c["failure_class"]) for c in rendered["cells"]]
        == [(c["id"], c["status"], c["failure_class"]) for c in stored["cells"]]
        == [("pass-r2", "passed", None), ("fail-r2", "failed", "runtime")]
    )


def test_a_lost_port_is_retried_once_on_another(run_matrix, pytester):
    """The first try's rendezvous port is taken between our check and the bind: the cell runs again elsewhere."""
    flag = pytester.path / "first-try-done"
    result = run_matrix(
        fake_matrix(modes=["porttaken"], args=f', "--flag", "{flag}"'),
        f"--simplefsdp-json={pytester.path / 'run.json'}",
    )
    result.assert_outcomes(passed=1)
    cell = run_doc((pytester.path / "run.json"))["cells"][0]
    assert flag.exists() and cell["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    assert any(
        d.startswith("first try: rendezvous port ") and "is already in use" in d and "; relaunched on port " in d
        for d in cell["details"]
    ), cell["details"]


def test_the_default_ranks_limit_is_one_per_gb_of_available_memory(run_matrix):
    import psutil

    limit = int(psutil.virtual_memory().available / 1e9)
    result = run_matrix(fake_matrix(ranks=[limit + 100]))
    result.assert_outcomes(failed=1)
    line = next(x for x in result.stdout.lines if "ranks do not fit this machine" in x)
    assert f"[infra] {limit + 100} ranks do not fit this machine: at most " in line
    assert abs(int(line.split("at most ")[1].split()[0]) - limit) <= 2  # memory moves a little meanwhile
    assert "default one per GB of available memory" in line
    assert not marked(f"pass-r{limit + 100}")


def test_ordinary_test_files_are_not_collected_in_matrix_mode(run_matrix, pytester):
    pytester.makepyfile(test_ordinary="def test_would_fail():\n    assert False\n")
    result = run_matrix(fake_matrix(), "-v")
    result.assert_outcomes(passed=1)
    assert "test_would_fail" not in result.stdout.str() and "test_ordinary.py" not in result.stdout.str()
    plain = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")  # and without the flag they are
    plain.assert_outcomes(failed=1)


def test_the_session_fails_loudly_when_a_process_of_it_survives(run_matrix, pytester):
    """A process of this session that no cell owns (here, started by a conftest) is found, named and killed
    at the end, and the run fails although every cell passed."""
    pytester.makeconftest("""
        import os, subprocess, sys
        from pytest_simplefsdp.launch import procs as launch

        def pytest_sessionstart(session):
            env = dict(os.environ, **{launch.MARKER: f"stray:{launch.SESSION}:conftest"})
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # stray-of-conftest"], env=env)
        """)
    result = run_matrix(fake_matrix())
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp: processes outlived the run (killed now)*",
            "pid *: *python* -c import time; time.sleep(600)  # stray-of-conftest*",
        ]
    )
    assert not marked("stray:")


def test_without_the_flag_a_bad_option_value_is_not_read(pytester):
    """A plain test run does not validate the matrix's options: a stale ini value cannot break it."""
    pytester.makeini("[pytest]\nsimplefsdp_timeout = soon\nsimplefsdp_compare = missing.json\n")
    pytester.makepyfile(test_plain="def test_ok():\n    assert True\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-profile=cpu", "--simplefsdp-dry-run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--simplefsdp-timeout: not a number: 'soon'*"])


def test_the_main_command_collects_in_this_repository_with_its_test_conftest_loaded():
    """`pytest --simplefsdp-matrix` in this checkout (the README's main job) also loads tests/conftest.py
    (testpaths): its hooks must take cell items as well as test functions."""
    repo = Path(__file__).parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--simplefsdp-matrix", "--co", "-q", "-m", "smoke", "-p", "no:cacheprovider"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "matrix/cpu.yaml::llama3-dp2-eager" in proc.stdout and "INTERNALERROR" not in proc.stdout


def test_the_output_folder_ignores_itself_and_collect_only_writes_none(run_matrix, pytester):
    """A run in a git checkout (a torchtitan checkout) leaves `git status` clean of `.simplefsdp/` (seed checkpoints,
    environments: gigabytes), as pytest's own cache folder does; --co and the dry run make no such folder."""
    subprocess.run([*GIT, "init", "-q", str(pytester.path)], check=True)
    run_matrix(fake_matrix(), "--co").assert_outcomes()
    assert not (pytester.path / ".simplefsdp").exists()
    run_matrix(fake_matrix(), "--simplefsdp-dry-run")
    assert not (pytester.path / ".simplefsdp").exists()
    run_matrix(fake_matrix()).assert_outcomes(passed=1)
    assert (pytester.path / ".simplefsdp" / ".gitignore").read_text().endswith("*\n")
    status = subprocess.run(
        ["git", "-C", str(pytester.path), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".simplefsdp" not in status and "fake.yaml" in status, status
