"""Gating a torchtitan pull request against its base (--simplefsdp-base), on fake ranks: the base is a commit of a
fake torchtitan git checkout whose stand-in package says (broken.txt) which modes fail there; the PR's side is the
torchtitan pytest runs with, told by $FAKE_TORCHTITAN_SAYS. uv builds the base's environment from the checkout,
offline (uv's own build backend), and keeps it per commit."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import GIT, cells_of, commit_all, fake_checkout, fake_matrix, module_matrix, report_tool

pytestmark = pytest.mark.fake


def commit(repo, broken: str, message: str) -> str:
    (repo / "torchtitan" / "broken.txt").write_text(broken)
    return commit_all(repo, message)


@pytest.fixture
def titan_repo(tmp_path, monkeypatch):
    """A fake torchtitan checkout: `main` (the base: mode `trunk` fails there, `differs` fails otherwise, `flaky`
    every second run) and the branch `pr` one commit on, checked out."""
    if shutil.which("uv") is None and not os.path.exists(os.path.join(os.path.dirname(os.sys.executable), "uv")):
        pytest.skip("uv is not installed (pip install uv; tox installs it)")
    repo = tmp_path / "torchtitan-checkout"
    fake_checkout(repo)
    base = commit(repo, "trunk\ndiffers other\n", "the base")
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-qb", "pr"], check=True)
    commit(repo, "", "the pull request")
    monkeypatch.setenv("UV_NO_INDEX", "1")  # (offline: uv's own build backend needs no index)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return repo, base


def pr_matrix(pr_says, modes):
    text = fake_matrix(modes=modes, args=', "--torchtitan-says"')
    return text.replace("target:\n", f'target:\n  env: {{FAKE_TORCHTITAN_SAYS: "{pr_says}"}}\n')


KNOWN = (
    "- id: known-one\n  when: {mode: known}\n  error: 'fake failure'\n  kind: xfail\n"
    "  link: https://github.com/pytorch/torchtitan/issues/1\n  reason: a known bug\n"
)


def test_failures_are_new_broken_trunk_flaky_or_known_and_only_new_ones_fail(run_matrix, pytester, titan_repo):
    repo, base = titan_repo
    says = pytester.path / "pr-says.txt"  # what fails on the PR
    says.write_text("fail\ntrunk\ndiffers\nflaky flaky\nknown\n")
    kf = pytester.path / "kf.yaml"
    kf.write_text(KNOWN)
    out, md = pytester.path / "run.json", pytester.path / "status.md"
    result = run_matrix(
        pr_matrix(says, ["pass", "fail", "trunk", "differs", "flaky", "known"]),
        "--simplefsdp-base",
        f"--simplefsdp-torchtitan-repo={repo}",
        "--simplefsdp-confirm=2",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-status-md={md}",
        "-rA",
    )
    result.assert_outcomes(passed=1, failed=2, xfailed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cells = cells_of(out)
    assert {c["id"].split("-r2")[0]: c.get("gate") for c in cells.values()} == {
        "pass": None,
        "fail": "new",
        "trunk": "broken trunk",
        "differs": "new",
        "flaky": "flaky",
        "known": "known",
    }
    assert cells["fail-r2"]["base"]["passed"] == 2 and cells["fail-r2"]["base"]["commit"] == base
    assert cells["trunk-r2"]["base"]["signatures"] == [cells["trunk-r2"]["signature"]]
    assert cells["differs-r2"]["base"]["signatures"] == [
        "ValueError: another fake error on the base @ fakes/fake_rank.py:main"
    ]
    assert cells["flaky-r2"]["base"]["runs"] == 0  # its own runs disagreed: not run on the base
    assert "base" not in cells["pass-r2"] or cells["pass-r2"]["base"] is None  # passing cells are not rerun
    ref = f"merge-base(HEAD, main) ({base})"
    result.stdout.fnmatch_lines([f"simplefsdp: PR gate: each failure runs again on base {ref} of {repo}*"])
    result.stdout.fnmatch_lines(
        [
            f"*simplefsdp PR gate against base {ref}: 2 new, 1 broken trunk, 1 flaky, 1 known*",
            "*fake::differs-r2*new*RuntimeError: fake failure on purpose*failed 2 of 2: "
            "ValueError: another fake error on the base*",
            "*fake::fail-r2*new*passed 2 of 2*",
            "*fake::trunk-r2*broken trunk*failed 2 of 2: RuntimeError: fake failure*",
        ]
    )
    result.stdout.fnmatch_lines([f"XFAIL*trunk-r2*broken trunk: fails on base {ref} too, with the same signature*"])
    doc = json.loads(out.read_text())
    assert doc["gate"]["counts"] == {"new": 2, "broken trunk": 1, "flaky": 1, "known": 1}
    assert doc["runs"][0]["meta"]["base"] == {"ref": "merge-base(HEAD, main)", "commit": base, "repo": str(repo)}
    text = md.read_text()
    assert f"### PR gate against base {ref}: 2 new" in text and "| `fake::trunk-r2` | broken trunk |" in text

    stored = report_tool(str(out), "--format", "md", cwd=pytester.path)  # judged again: each class stands
    assert stored.returncode == 0, stored.stderr
    assert f"### PR gate against base {ref}: 2 new, 1 broken trunk, 1 flaky, 1 known" in stored.stdout
    # the report tool's document of the stored run is the live run's: every cell's decision and the gate's block
    tool = json.loads(report_tool(str(out), "--format", "json", cwd=pytester.path).stdout)
    keys = ("status", "verdict", "flaky", "gate", "known_failure", "signature")
    assert [{k: c.get(k) for k in keys} for c in tool["runs"][0]["cells"]] == [
        {k: c.get(k) for k in keys} for c in doc["runs"][0]["cells"]
    ]
    assert tool["gate"] == doc["gate"]
    kf_now = pytester.path / "kf-now.yaml"  # judged against a file that knows `fail` too: its block says so
    kf_now.write_text(KNOWN + KNOWN.replace("known-one", "known-two").replace("{mode: known}", "{mode: fail}"))
    now = json.loads(report_tool(str(out), "--format", "json", "--known-failures", kf_now, cwd=pytester.path).stdout)
    assert now["gate"]["counts"] == {"new": 1, "broken trunk": 1, "flaky": 1, "known": 2}, now["gate"]["counts"]
    envs = list((pytester.path / ".simplefsdp" / "envs").glob(f"torchtitan-{base}-*"))
    assert len(envs) == 1  # one environment for the base, kept by its content key
    again = run_matrix(
        pr_matrix(says, ["trunk", "known"]),
        f"--simplefsdp-base={base}",
        f"--simplefsdp-torchtitan-repo={repo}",
        f"--simplefsdp-known-failures={kf}",
    )
    again.assert_outcomes(xfailed=2)  # nothing new: the gate passes
    assert again.ret == pytest.ExitCode.OK
    assert list((pytester.path / ".simplefsdp" / "envs").glob(f"torchtitan-{base}-*")) == envs  # kept, not rebuilt


SMOKE_NUMERICS = """\
smoke:
  - {mode: pass}
numerics:
  global_batch_size: 8
  baseline: {mode: pass}
  lanes:
    - name: exact
"""


def test_a_pr_that_moves_every_layout_alike_is_reported_as_numerics_changed_vs_the_base(
    run_matrix, pytester, titan_repo
):
    """The PR shifts the losses of every cell alike (`pass shift`: its baseline is itself, so a cell-vs-baseline check
    sees nothing): the passing smoke cell, run once more on the base, shows the change and its size. ``report`` (the
    default) passes the gate and says so; ``fail`` fails it as new; ``off`` runs nothing on the base; a PR that
    changes nothing is compared and found bit for bit the same."""
    repo, base = titan_repo
    says = pytester.path / "pr-says.txt"
    says.write_text("pass shift\n")
    text = pr_matrix(says, ["pass"]) + SMOKE_NUMERICS
    out, md = pytester.path / "run.json", pytester.path / "status.md"
    common = ("--simplefsdp-base", f"--simplefsdp-torchtitan-repo={repo}", f"--simplefsdp-json={out}")
    reported = run_matrix(text, *common, f"--simplefsdp-status-md={md}")
    reported.assert_outcomes(passed=1)
    cell = cells_of(out)["pass-r2"]
    assert cell["base_numerics"]["changed"] is True and cell["base_numerics"]["beyond"] is True
    assert cell["base_numerics"]["size"]["loss"] == pytest.approx(3e-4, rel=1e-3)  # step 3: 10/3 + 1e-3
    assert cell["base_numerics"]["commit"] == base and "/base-numerics-" in cell["base_numerics"]["folder"]
    reported.stdout.fnmatch_lines(
        [
            "numerics vs the base: 1 of 1 passing smoke cell(s) compared changed",
            f"  fake::pass-r2: numerics changed vs the base *{base}*: largest relative change "
            "loss 3.00e-04; beyond the cell's tolerance (lane exact)",
        ]
    )
    assert "**numerics vs the base: 1 of 1" in md.read_text()
    assert json.loads(out.read_text())["gate"]["numerics"]["compared"] == 1
    failed = run_matrix(text, *common, "--simplefsdp-base-numerics=fail")
    failed.assert_outcomes(failed=1)
    cell = cells_of(out)["pass-r2"]
    assert (cell["gate"], cell["failure_class"]) == ("new", "numerics"), cell
    failed.stdout.fnmatch_lines(["*PR gate against base*: 1 new*", "*fake::pass-r2*new*numerics changed vs the base*"])
    off = run_matrix(text, *common, "--simplefsdp-base-numerics=off")
    off.assert_outcomes(passed=1)
    assert cells_of(out)["pass-r2"].get("base_numerics") is None
    says.write_text("")  # a PR that leaves the numerics alone
    same = run_matrix(text, *common)
    same.assert_outcomes(passed=1)
    assert cells_of(out)["pass-r2"]["base_numerics"]["changed"] is False
    same.stdout.fnmatch_lines(
        ["numerics vs the base: 0 of 1 passing smoke cell(s) compared changed (bit for bit the same)"]
    )
    bad = run_matrix(text, *common, "--simplefsdp-base-numerics=always")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--simplefsdp-base-numerics: unknown value 'always'; known: report, fail, off*"])


def test_a_bad_base_is_a_usage_error_before_any_cell(run_matrix, pytester, titan_repo):
    repo, _ = titan_repo
    says = pytester.path / "pr-says.txt"
    says.write_text("fail\n")
    result = run_matrix(
        pr_matrix(says, ["fail"]), "--simplefsdp-base=no-such-ref", f"--simplefsdp-torchtitan-repo={repo}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--simplefsdp-base=no-such-ref: git rev-parse*no-such-ref*"])
    assert not (pytester.path / "runs").exists()
    twin = run_matrix(pr_matrix(says, ["fail"]), "--simplefsdp-base", "--simplefsdp-twin=torch==2.15.0")
    assert twin.ret == pytest.ExitCode.USAGE_ERROR
    twin.stderr.fnmatch_lines(["*--simplefsdp-base reruns failures on the base's torchtitan*"])
    nowhere = run_matrix(pr_matrix(says, ["fail"]), "--simplefsdp-base")
    assert nowhere.ret == pytest.ExitCode.USAGE_ERROR
    nowhere.stderr.fnmatch_lines(["*--simplefsdp-base=merge-base: no torchtitan git checkout to take it from*"])


def test_a_base_that_could_not_run_clears_nothing_and_a_base_that_disagrees_is_flaky():
    """In-process, on results as the runner makes them: no base run to compare with leaves the failure new (the
    gate stays shut), saying why; a base whose runs disagree makes the failure flaky."""
    from pytest_simplefsdp.judge.gate import Base, classify
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.kinds import FailureClass, GateClass

    base = Base("main", "0123456789ab", "/repo")
    mine = CellResult("c", {}, failure_class=FailureClass.RUNTIME, error_line="RuntimeError: boom")
    mine.fail(FailureClass.RUNTIME, "RuntimeError: boom")
    gone = CellResult("c/base", {}, not_run=True)
    gone.fail(FailureClass.INFRA, "torchtitan@0123456789ab: uv: no such commit")
    cls, verdict, rec = classify(mine, [gone], base)
    assert cls == GateClass.NEW and "could not run (torchtitan@0123456789ab: uv: no such commit)" in verdict
    assert rec["runs"] == 0 and rec["not_run"] == ["torchtitan@0123456789ab: uv: no such commit"]
    failing = CellResult("c/base-1", {})
    failing.fail(FailureClass.RUNTIME, "RuntimeError: boom")
    cls, verdict, rec = classify(mine, [failing, CellResult("c/base-2", {})], base)
    assert cls == GateClass.FLAKY and verdict == (
        "flaky: fails here, and on base main (0123456789ab) failed the same way and passed 1 of 2 runs"
    )
    assert (rec["runs"], rec["passed"]) == (2, 1)
    # issue 58, Why 3: a base that passes once and fails once with another error clears nothing
    other = CellResult("c/base-1", {})
    other.fail(FailureClass.RUNTIME, "ValueError: something else")
    cls, verdict, rec = classify(mine, [other, CellResult("c/base-2", {})], base)
    assert cls == GateClass.NEW and verdict.startswith(
        "new: fails here; on base main (0123456789ab) passed 1 of 2 runs and failed otherwise differently"
    )


def test_a_known_failure_by_an_entry_the_base_lacks_says_so(run_matrix, pytester, titan_repo):
    """Issue 58, Why 4: the known-failures file is the checkout's own; the base has entry known-one, the PR adds
    known-two for `fail`: both cells xfail (known), and the one the PR's own entry clears says so in its verdict, the
    gate's table and headline, live and judged again by the report tool."""
    repo, base = titan_repo
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-q", "main"], check=True)
    kf = repo / "known_failures.yaml"
    kf.write_text(KNOWN)
    subprocess.run([*GIT, "-C", str(repo), "add", "-f", kf.name], check=True)  # (the fake's .gitignore has *.yaml)
    base = commit_all(repo, "the base's known failures")
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-q", "pr"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "merge", "-q", "main", "-m", "merge"], check=True)
    kf.write_text(KNOWN + KNOWN.replace("known-one", "known-two").replace("{mode: known}", "{mode: fail}"))
    says = pytester.path / "pr-says.txt"
    says.write_text("fail\nknown\n")
    out = pytester.path / "run.json"
    result = run_matrix(
        pr_matrix(says, ["fail", "known"]),
        "--simplefsdp-base",
        f"--simplefsdp-torchtitan-repo={repo}",
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-json={out}",
        "-rA",
    )
    result.assert_outcomes(xfailed=2)
    cells = cells_of(out)
    added, kept = cells["fail-r2"], cells["known-r2"]
    assert (added["gate"], kept["gate"]) == ("known", "known")
    assert added["verdict"].startswith(
        "xfailed by an entry this PR adds (the base's known-failures file has no known-two): known failure known-two"
    )
    assert kept["verdict"].startswith("known failure known-one")
    doc = json.loads(out.read_text())
    assert doc["runs"][0]["meta"]["base"]["entries"] == ["known-one"] and doc["gate"]["added"] == 1
    result.stdout.fnmatch_lines(
        [
            f"*PR gate against base merge-base(HEAD, main) ({base}): 0 new, 0 broken trunk, 0 flaky, 2 known "
            "(1 xfailed by an entry this PR adds)*",
            "*fake::fail-r2*known*not rerun; its entry is added by this PR*",
        ]
    )
    again = json.loads(report_tool(str(out), "--format", "json", cwd=pytester.path).stdout)
    assert again["gate"]["added"] == 1 and again["gate"]["counts"]["known"] == 2


def test_the_base_numerics_line_never_calls_uncompared_cells_the_same():
    """Issue 58, Why 4: a smoke cell that could not run on the base was compared with nothing: the line says so
    (on the landed revision: "0 of 0 ... compared changed (bit for bit the same)")."""
    from pytest_simplefsdp.report.gate import numerics_lines

    failed_there = {"cell": "cpu::a", "line": "not compared: the cell failed on the base", "beyond": False}
    doc = {"numerics": {"compared": 0, "changed": [{**failed_there, "size": {}, "compared": False}]}}
    lines = numerics_lines(doc)
    assert lines[0] == (
        "numerics vs the base: no passing smoke cell could be compared; 1 could not be compared (it did not pass "
        "on the base)"
    )
    assert not any("bit for bit" in line for line in lines)
    same = {"numerics": {"compared": 2, "changed": [{**failed_there, "size": {}, "compared": False}]}}
    assert numerics_lines(same)[0].startswith(
        "numerics vs the base: 0 of 2 passing smoke cell(s) compared changed (bit for bit the same); 1 could not"
    )


def test_a_feature_whose_cell_the_gate_let_through_is_not_done():
    """The status by feature: a broken-trunk or flaky failure is an expected failure of the gate with no entry; the
    feature still fails (never Done, never In progress with no entry to link)."""
    from pytest_simplefsdp.report.status import FAILING, Feature

    ok = {"id": "a", "status": "passed"}
    for gate in ("broken trunk", "flaky"):
        trunk = {"id": "b", "status": "xfailed", "failure_class": "runtime", "gate": gate}
        assert Feature("EP", 2, [ok, trunk]).state == FAILING
    known = {"id": "b", "status": "xfailed", "failure_class": "runtime", "gate": "known", "known_failure": "k"}
    assert Feature("EP", 2, [ok, known]).state != FAILING


def test_a_torchtitan_commit_bisection_finds_the_commit_on_a_fake_checkout(run_matrix, pytester, titan_repo):
    """--simplefsdp-bisect=torchtitan over GOOD..BAD commits of a checkout: an environment per probed commit, built by
    uv from the checkout; the regression planted two commits after the PR's is found to its commit."""
    repo, base = titan_repo
    subprocess.run(
        ["git", "-C", str(repo), "remote", "add", "origin", "git@github.com:pytorch/torchtitan.git"], check=True
    )
    harmless = commit(repo, "", "harmless")
    planted = commit(repo, "regress\n", "the regression")
    head = commit(repo, "regress\n", "after it")
    out = pytester.path / "run.json"
    result = run_matrix(
        pr_matrix(pytester.path / "nothing-said.txt", ["regress"]),
        f"--simplefsdp-versions=torchtitan@{head}",
        f"--simplefsdp-torchtitan-repo={repo}",
        "--simplefsdp-bisect=torchtitan",
        f"--simplefsdp-bisect-versions={base}..{head}",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(failed=1)
    (found,) = json.loads(out.read_text())["bisections"]
    assert found["window"][1] == f"@{planted}", found
    link = f"https://github.com/pytorch/torchtitan/compare/{harmless}...{planted}"
    assert found["found"] == f"regressed in @{planted} (last good @{harmless}): {link}"
    result.stdout.fnmatch_lines([f"*simplefsdp bisect torchtitan: *: regressed in @{planted} (last good @{harmless})*"])
    assert {p["version"]: p["outcome"] for p in found["probes"]}[f"@{base}"] == "passes"


# --- run from inside the checkout, as the README's gate runs: the base, a twin's side and a bisection's probes must
# run their own commit's code, never the checkout the working folder holds (its torchtitan first on a `python -m`
# rank's path)


@pytest.fixture
def checkout_here(pytester, monkeypatch):
    """The folder pytest runs in is a fake torchtitan checkout: `main` at the base, where mode `ep` fails with
    another error than on the PR; branch `pr` one commit on, checked out (its working tree: the PR's code)."""
    if shutil.which("uv") is None and not os.path.exists(os.path.join(os.path.dirname(os.sys.executable), "uv")):
        pytest.skip("uv is not installed (pip install uv; tox installs it)")
    fake_checkout(pytester.path)
    base = commit(pytester.path, "ep other\n", "the base: EP refused")
    subprocess.run([*GIT, "-C", str(pytester.path), "checkout", "-qb", "pr"], check=True)
    commit(pytester.path, "ep\n", "the pull request: EP refused another way")
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(pytester.path.parent / "uv-cache"))
    return base


def here_matrix(modes):
    """The fake rank as `python -m fake_rank`: started in the checkout, the checkout's torchtitan is first on its
    path unless the launch keeps the working folder off it (the PR's side: the checkout is the code under test)."""
    return module_matrix(modes, args=', "--torchtitan-says"')


def imported_commit(folder):
    return json.loads((Path(folder) / "evidence" / "rank0.json").read_text())["imported"]["torchtitan"]


def test_a_pr_gated_from_inside_its_checkout_runs_the_base_on_the_bases_code(run_matrix, pytester, checkout_here):
    """The planted PR of issue 45: the base refuses EP (ValueError here), the PR refuses it another way. Gated from
    the checkout's root, the base's ranks ran the PR's working tree and the failure passed as broken trunk; now the
    base runs its own commit, proved by what its ranks imported, and the failure is new."""
    base = checkout_here
    out = pytester.path / "run.json"
    result = run_matrix(here_matrix(["pass", "ep"]), "--simplefsdp-base", f"--simplefsdp-json={out}", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cell = cells_of(out)["ep-r2"]
    assert cell["gate"] == "new" and cell["error_line"] == "RuntimeError: fake failure on purpose", cell
    assert cell["base"]["signatures"] == ["ValueError: another fake error on the base @ fakes/fake_rank.py:main"], cell[
        "base"
    ]
    proof = imported_commit(cell["base"]["folders"][0])
    assert proof["commit"].startswith(base) and "/.simplefsdp/envs/" in proof["file"], proof
    result.stdout.fnmatch_lines(["*simplefsdp PR gate against base *: 1 new, 0 broken trunk*"])


def test_a_twin_run_from_inside_the_checkout_runs_the_other_side_on_its_commit(run_matrix, pytester, checkout_here):
    base = checkout_here
    out = pytester.path / "run.json"
    run_matrix(
        here_matrix(["ep"]),
        f"--simplefsdp-twin=torchtitan@{base}",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-torchtitan-repo={pytester.path}",
    )  # (the bisection's test takes the default: the rootdir)
    cells = cells_of(out)
    assert cells["ep-r2"]["error_line"] == "RuntimeError: fake failure on purpose"  # the checkout: the PR
    twin = cells[f"ep-r2-torchtitan-{base}"]
    assert twin["error_line"] == "ValueError: another fake error on the base", twin
    assert twin["imported"]["torchtitan"]["commit"].startswith(base), twin["imported"]


def test_a_bisection_from_inside_the_checkout_probes_each_commit(run_matrix, pytester, checkout_here):
    """main: nothing broken, harmless, the regression (EP refused: ValueError), after it; the checkout holds the PR
    (EP refused another way). Every probe that imported the checkout would fail with the PR's error: no window."""
    repo = pytester.path
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-q", "-b", "history", checkout_here + "~0"], check=True)
    start = commit(repo, "", "nothing broken")
    commit(repo, "", "harmless")
    planted = commit(repo, "ep other\n", "the regression")
    head = commit(repo, "ep other\n", "after it")
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-q", "pr"], check=True)
    out = repo / "run.json"
    result = run_matrix(
        here_matrix(["ep"]),
        f"--simplefsdp-versions=torchtitan@{head}",
        "--simplefsdp-bisect=torchtitan",
        f"--simplefsdp-bisect-versions={start}..{head}",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(failed=1)
    (found,) = json.loads(out.read_text())["bisections"]
    assert found["window"][1] == f"@{planted}", found


def test_a_version_set_whose_ranks_imported_other_code_is_infra_naming_both(run_matrix, pytester, checkout_here):
    """The proof, shown catching what the safe path prevents: the target's own PYTHONPATH puts the checkout ahead of
    the base's environment. The base's runs ran the PR's code (which fails there with the PR's signature, so the
    failure would pass as broken trunk): each is infra naming what it imported and what it should have, the base
    could not run, and nothing clears the failure."""
    base = checkout_here
    text = here_matrix(["ep"]).replace('PYTHONPATH: "', f'PYTHONPATH: "{pytester.path}:')
    out = pytester.path / "run.json"
    result = run_matrix(text, "--simplefsdp-base", f"--simplefsdp-json={out}")
    result.assert_outcomes(failed=1)
    cell = cells_of(out)["ep-r2"]
    assert cell["gate"] == "new" and cell["base"]["runs"] == 0, cell["base"]
    (why,) = cell["base"]["not_run"]
    pr = subprocess.run(
        ["git", "-C", str(pytester.path), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert why.startswith(
        f"the ranks did not run version set torchtitan@{base}: rank 0 imported torchtitan (no "
        f"version) @{pr} from {pytester.path}/torchtitan, not its environment "
    ), why
