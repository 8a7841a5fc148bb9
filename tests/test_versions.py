"""Versions as a dimension, on fake ranks whose outcome depends on the version of "torch" in their environment: the
environments are real (uv builds them) but "torch" there is a stand-in wheel from a local folder, so every test
runs offline in seconds. Twin runs, bisection (untestable versions, a flaky probe, another error, ends alike),
known-failure windows, and the bad inputs."""

import json
import os
import shlex
import shutil
import subprocess

import pytest

from pytest_simplefsdp.session.bisecting import commits, short_sha
from pytest_simplefsdp.versions.bisect import FAILS, FLAKY, OTHER, PASSES, UNTESTABLE, Probe, bisect

from helpers import cells_of, fake_matrix, fake_wheel

pytestmark = pytest.mark.fake


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """A folder of stand-in torch wheels (2.10.0 ... 2.15.0, no 2.11.0) that uv installs from, offline."""
    if shutil.which("uv") is None and not (os.path.exists(os.path.join(os.path.dirname(os.sys.executable), "uv"))):
        pytest.skip("uv is not installed (pip install uv; tox installs it)")
    folder = tmp_path / "wheels"
    for v in ("2.10.0", "2.12.0", "2.13.0", "2.14.0", "2.15.0"):
        fake_wheel(folder, "torch", v)
    monkeypatch.setenv("UV_FIND_LINKS", str(folder))
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return folder


def regression(extra_args="", **kw):
    """The fake rank, failing from torch 2.15.0 on (rank 1, step 2): the torch pytest runs with (2.14.1) passes."""
    return fake_matrix(args=f', "--breaks-from", "2.15.0"{extra_args}', **kw)


def test_a_twin_run_tables_what_differs_and_names_the_versions_each_cell_ran(run_matrix, pytester, wheels):
    out = pytester.path / "run.json"
    result = run_matrix(regression(), "--simplefsdp-twin=torch==2.15.0", f"--simplefsdp-json={out}", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    cells = cells_of(out)
    assert set(cells) == {"pass-r2", "pass-r2-torch-2.15.0"}
    assert cells["pass-r2-torch-2.15.0"]["versions"]["torch"] == "2.15.0"
    assert cells["pass-r2"]["versions"]["torch"].startswith("2.14.1")  # the environment pytest runs in
    assert cells["pass-r2-torch-2.15.0"]["error_line"] == "RuntimeError: fake regression: broken since torch 2.15.0"
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp twin: fake, twin run installed (*torch 2.14.1*) vs torch==2.15.0: "
            "1 cell on both; 0 behave the same (0 with bitwise equal losses); 1 differs*",
            "pass-r2 *passed*failed runtime*verdict; signature: RuntimeError: fake regression*",
        ]
    )
    envs = list((pytester.path / ".simplefsdp" / "envs").glob("torch-2.15.0-*"))
    assert len(envs) == 1 and json.loads((envs[0] / "env.json").read_text())["versions"]["torch"] == "2.15.0"
    again = run_matrix(regression(), "--simplefsdp-twin=torch==2.15.0", f"--simplefsdp-json={out}")
    again.assert_outcomes(passed=1, failed=1)  # the kept environment: nothing built the second time
    assert list((pytester.path / ".simplefsdp" / "envs").glob("torch-2.15.0-*")) == envs


def test_a_cell_named_with_a_twin_runs_on_both_sets_and_one_named_with_its_set_on_that_one(
    run_matrix, pytester, wheels
):
    """`pytest --simplefsdp-matrix fake.yaml::pass-r2 --simplefsdp-twin=...` means the cell on every set (it once
    ran only the installed side: "0 cells on both"); the twin side's own id names that side alone."""
    matrix = regression(modes=["pass", "fail"])
    named = run_matrix(matrix, "fake.yaml::pass-r2", "--simplefsdp-twin=torch==2.15.0")
    named.assert_outcomes(passed=1, failed=1, deselected=2)
    named.stdout.fnmatch_lines(["*twin run installed (*) vs torch==2.15.0: 1 cell on both*"])
    one = run_matrix(matrix, "fake.yaml::pass-r2-torch-2.15.0", "--simplefsdp-twin=torch==2.15.0")
    one.assert_outcomes(failed=1, deselected=3)
    # the failure's rerun line: no path of this machine, the version set it ran on; run as printed, that cell alone
    rerun = next(line for line in one.stdout.lines if line.startswith("  rerun: ")).split(": ", 1)[1]
    assert rerun == "pytest --simplefsdp-matrix fake.yaml::pass-r2 --simplefsdp-versions=torch==2.15.0"
    again = pytester.runpytest_subprocess(
        *shlex.split(rerun)[1:], "--simplefsdp-launcher=local", "--simplefsdp-confirm=1"
    )
    again.assert_outcomes(failed=1, deselected=1)
    again.stdout.fnmatch_lines(["*fake.yaml::pass-r2-torch-2.15.0 FAILED*"])


def test_the_matrix_key_versions_is_an_axis_and_a_known_failure_window_is_checked(run_matrix, pytester, wheels):
    """`versions: {torch: [installed, 2.15.0]}` in the matrix file; an entry whose window says the cell fails from
    torch 2.16.0 on is not this failure: the cell fails, saying so."""
    kf = pytester.path / "kf.yaml"
    kf.write_text(
        "- id: regression\n  when: {mode: pass, torch: '>=2.15'}\n  error: 'fake regression'\n  kind: xfail\n"
        "  link: https://github.com/pytorch/pytorch/issues/1\n  reason: the regression\n"
        "  first_failing: {torch: 2.16.0}\n"
    )
    out = pytester.path / "run.json"
    result = run_matrix(
        regression(extra="versions: {torch: [installed, 2.15.0]}\n"),
        f"--simplefsdp-json={out}",
        f"--simplefsdp-known-failures={kf}",
    )
    result.assert_outcomes(passed=1, failed=1)
    cell = cells_of(out)["pass-r2-torch-2.15.0"]
    assert cell["axes"]["versions"] == "torch==2.15.0" and cell["column"] == "torch-2.15.0"
    assert cell["verdict"] == (
        "fails as known failure regression (https://github.com/pytorch/pytorch/issues/1) says, "
        "but torch 2.15.0 is before its first failing torch 2.16.0: its window is wrong, or "
        "this is another regression"
    )


def test_bisection_finds_the_window_skipping_untestable_flaky_and_other_versions(run_matrix, pytester, wheels):
    """torch 2.10.0 ... 2.15.0: 2.11.0 has no wheel (untestable), 2.12.0 fails with another error, 2.14.0 fails
    every second run (flaky); the regression is there from 2.15.0. Every probe is confirmed by two runs. The window
    is (2.13.0, 2.15.0), written into the new entry by the update, with an issue body beside the run."""
    kf = pytester.path / "kf.yaml"
    kf.write_text("# our known failures\n[]\n")
    text = regression(', "--other-at", "2.12.0", "--flaky-at", "2.14.0"')
    out = pytester.path / "run.json"
    result = run_matrix(
        text,
        "--simplefsdp-versions=torch==2.15.0",
        "--simplefsdp-bisect=torch",
        "--simplefsdp-confirm=2",
        "--simplefsdp-bisect-versions=2.10.0,2.11.0,2.12.0,2.13.0,2.14.0,2.15.0",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-known-failures={kf}",
        "--simplefsdp-update-known-failures",
    )
    result.assert_outcomes(failed=1)
    doc = json.loads(out.read_text())
    b = doc["bisections"][0]
    outcomes = {p["version"]: p["outcome"] for p in b["probes"]}
    assert b["window"] == ["2.13.0", "2.15.0"], b
    assert outcomes["2.10.0"] == PASSES and outcomes["2.15.0"] == FAILS and outcomes["2.13.0"] == PASSES
    assert outcomes.get("2.11.0") in (None, UNTESTABLE) and outcomes.get("2.12.0") in (None, OTHER)
    assert outcomes["2.14.0"] == FLAKY  # (fails on 2.14.0 only every second run: skipped, not counted)
    # 2.12.0's other error is a regression of its own in the window: searched for in turn, reported apart
    (other,) = doc["bisections"][1:]
    assert other["second_regression"] != b.get("second_regression") and other["window"] == ["2.10.0", "2.12.0"]
    result.stdout.fnmatch_lines(
        ["*simplefsdp bisect torch: fake::pass-r2-torch-2.15.0: regressed in 2.15.0 (last good 2.13.0)*"]
    )
    issue = (pytester.path / "runs" / "bisect" / "pass-r2-torch-2.15.0-torch.md").read_text()
    assert "**Window (torch):** regressed in 2.15.0 (last good 2.13.0)" in issue
    # portable: the failing side's version set, no path of this machine
    assert "```sh\npytest --simplefsdp-matrix fake.yaml::pass-r2 --simplefsdp-versions=torch==2.15.0\n```" in issue
    assert str(pytester.path) not in issue.split("## The failing rank's log")[0]
    entry = kf.read_text()
    assert entry.startswith("# our known failures\n") and "first_failing: {torch: 2.15.0}" in entry
    assert "versions:" not in entry  # the window scopes it, not the version set the cell happened to run on
    assert "last_passing: {torch: 2.13.0}" in entry and "link: 'TODO: the upstream issue'" in entry
    again = run_matrix(text, "--simplefsdp-versions=torch==2.15.0", f"--simplefsdp-known-failures={kf}")
    again.assert_outcomes(xfailed=1)  # the file the update wrote loads, and judges the cell
    again.stdout.fnmatch_lines(["*1 known-failure entries have no link yet (TODO*"])


def test_a_fix_is_bisected_to_its_release_and_its_issue_reproduces_the_failing_side(run_matrix, pytester, wheels):
    """Fails before torch 2.13.0, passes from it: the window (2.12.0, 2.13.0) is where it was fixed; the issue body's
    reproducer runs the cell on the failing side's torch (2.12.0)."""
    text = fake_matrix(args=', "--fixed-from", "2.13.0"')
    out = pytester.path / "run.json"
    result = run_matrix(
        text,
        "--simplefsdp-versions=torch==2.10.0",
        "--simplefsdp-bisect=torch",
        "--simplefsdp-bisect-versions=2.10.0,2.12.0,2.13.0,2.15.0",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(failed=1)
    assert json.loads(out.read_text())["bisections"][0]["window"] == ["2.12.0", "2.13.0"]
    issue = (pytester.path / "runs" / "bisect" / "pass-r2-torch-2.10.0-torch.md").read_text()
    assert "pytest --simplefsdp-matrix fake.yaml::pass-r2 --simplefsdp-versions=torch==2.12.0\n" in issue, issue
    assert "the failing side ran torch==2.12.0" in issue
    assert "**Window (torch):** fixed in 2.13.0 (last failing 2.12.0)" in issue
    assert "/bin/python -m" not in issue.replace(" .venv/bin/python -m", "")  # (no interpreter of this machine)


def test_a_bisection_whose_ends_agree_says_so_and_searches_nothing(run_matrix, pytester, wheels):
    text = regression().replace('"--breaks-from", "2.15.0"', '"--breaks-from", "2.0.0"')  # fails everywhere
    out = pytester.path / "run.json"
    result = run_matrix(
        text,
        "--simplefsdp-versions=torch==2.15.0",
        "--simplefsdp-bisect=torch",
        "--simplefsdp-bisect-versions=2.10.0,2.12.0,2.13.0,2.15.0",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(failed=1)
    b = json.loads(out.read_text())["bisections"][0]
    assert b["window"] is None and b["message"] == "both ends fails (2.10.0 and 2.15.0): nothing to bisect in this list"
    assert [p["version"] for p in b["probes"]] == ["2.10.0", "2.15.0"]  # the other end, and the run's own cell


def test_an_unknown_version_is_a_usage_error_naming_the_versions_there_are(run_matrix, wheels):
    result = run_matrix(fake_matrix(), "--simplefsdp-versions=torch==9.9.9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*version set torch==9.9.9: the index has no torch 9.9.9; its releases: "
            "2.10.0, 2.12.0, 2.13.0, 2.14.0, 2.15.0*"
        ]
    )
    bad = run_matrix(fake_matrix(), "--simplefsdp-versions=torch>=2")
    bad.stderr.fnmatch_lines(["*--simplefsdp-versions=torch>=2: 'torch>=2' is not a version pin: write torch==2.15.0*"])


def test_an_environment_that_cannot_be_built_fails_its_cells_as_infra_and_the_others_run(
    run_matrix, pytester, wheels, monkeypatch
):
    """No index reachable and no wheel for the version: the check cannot ask the index (said once, in the header),
    the build fails with uv's own line, every cell of that set is infra, the installed set's cells pass."""
    monkeypatch.delenv("UV_NO_INDEX")
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    out = pytester.path / "run.json"
    result = run_matrix(
        fake_matrix(modes=["pass", "fail"]),
        "--simplefsdp-versions=installed",
        "--simplefsdp-versions=torch==2.11.0",
        f"--simplefsdp-json={out}",
    )
    result.stdout.fnmatch_lines(["*the package index could not be asked for torch's releases*"])
    cells = cells_of(out)
    assert cells["pass-r2"]["status"] == "passed" and cells["fail-r2"]["failure_class"] == "runtime"
    for cid in ("pass-r2-torch-2.11.0", "fail-r2-torch-2.11.0"):
        assert cells[cid]["failure_class"] == "infra", cells[cid]
        assert cells[cid]["error_line"].startswith("no environment for torch==2.11.0: torch==2.11.0: "), cells[cid]


def test_a_cell_without_an_environment_is_not_confirmed_bisected_or_recorded(run_matrix, pytester, wheels, monkeypatch):
    """Its failure is the installer's, not the cell's: the same at every version, so no confirming run, no bisection
    (which would find both ends "failing" alike) and no known-failures entry; the run says why."""
    monkeypatch.delenv("UV_NO_INDEX")
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    kf, out = pytester.path / "kf.yaml", pytester.path / "run.json"
    kf.write_text("[]\n")
    result = run_matrix(
        fake_matrix(),
        "--simplefsdp-versions=torch==2.11.0",
        "--simplefsdp-bisect=torch",
        "--simplefsdp-bisect-versions=2.10.0,2.11.0,2.15.0",
        "--simplefsdp-confirm=2",
        f"--simplefsdp-known-failures={kf}",
        "--simplefsdp-update-known-failures",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(failed=1)
    cell = cells_of(out)["pass-r2-torch-2.11.0"]
    assert cell["failure_class"] == "infra" and cell["not_run"] and cell["confirm"] is None, cell
    [b] = json.loads(out.read_text())["bisections"]
    assert b["error"].startswith("not bisected: pass-r2-torch-2.11.0 did not run (no environment for torch==2.11.0")
    assert "probes" not in b and kf.read_text() == "[]\n"
    result.stdout.fnmatch_lines(["*not bisected: pass-r2-torch-2.11.0 did not run (no environment for*"])


def test_an_environment_is_refused_before_it_is_built_when_the_disk_is_too_small(run_matrix, pytester, wheels):
    """What one environment takes is what the largest kept one measured: more than the disk has free is refused
    before uv starts, naming the space needed and free; the installed set's cells still run."""
    kept = pytester.path / ".simplefsdp" / "envs" / "torch-9.0.0-000000000000"
    kept.mkdir(parents=True)
    (kept / "env.json").write_text(json.dumps({"set": "torch==9.0.0", "bytes": 2**60}))  # one exabyte
    out = pytester.path / "run.json"
    run_matrix(
        fake_matrix(),
        "--simplefsdp-versions=installed",
        "--simplefsdp-versions=torch==2.15.0",
        f"--simplefsdp-json={out}",
    )
    cells = cells_of(out)
    assert cells["pass-r2"]["status"] == "passed"
    line = cells["pass-r2-torch-2.15.0"]["error_line"]
    assert cells["pass-r2-torch-2.15.0"]["failure_class"] == "infra"
    assert "refused to build the torch==2.15.0 environment: it needs about 1073741824.0 GiB and " in line, line
    assert line.endswith(" GiB free"), line
    assert not list(kept.parent.glob("torch-2.15.0-*"))


def test_a_commit_range_is_listed_as_the_run_names_its_own_commit(tmp_path):
    """GOOD..BAD of a git checkout, oldest first, GOOD included, 12 hex digits; a commit however written (the
    run's own pin, `torchtitan@abc1234`) resolves to the same name, so the run's cell is the probe of its commit."""
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for n in range(4):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"c{n}"], check=True)
    shas = subprocess.run([*git, "rev-list", "--reverse", "HEAD"], capture_output=True, text=True).stdout.split()
    listed = commits(repo, f"{shas[0][:7]}..{shas[-1][:7]}")
    assert listed == [s[:12] for s in shas]
    assert short_sha(repo, shas[-1][:7]) == listed[-1]


def test_the_search_itself_on_a_fake_version_line():
    """bisect() alone: log2 probes on a long line, skips, and ends that agree."""
    versions = [f"1.{i}" for i in range(64)]
    calls = []

    def probe(v):
        calls.append(v)
        i = int(v.split(".")[1])
        return Probe(v, UNTESTABLE if i in (40, 41) else FAILS if i >= 42 else PASSES)

    found = bisect(versions, probe)
    assert found.window == ("1.39", "1.42") and len(calls) <= 10, calls  # 40 and 41 untestable: the window spans them
    found = bisect(versions, lambda v: Probe(v, PASSES))
    assert found.window is None and found.message.startswith("both ends passes")
