"""--simplefsdp-sentinel, rehearsed on a fake torchtitan checkout: two nightlies on main, a regression planted
between them; the second finds, confirms and bisects it to its commit and writes one issue body and one
known-failures draft per bug, with nothing typed in between."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_simplefsdp.yamlio import parse_yaml, plain

from helpers import GIT, commit_all, fake_checkout, fake_matrix

pytestmark = pytest.mark.fake


@pytest.fixture
def main_repo(tmp_path, monkeypatch):
    if shutil.which("uv") is None and not os.path.exists(os.path.join(os.path.dirname(os.sys.executable), "uv")):
        pytest.skip("uv is not installed (pip install uv; tox installs it)")
    repo = tmp_path / "torchtitan-checkout"
    fake_checkout(repo)
    subprocess.run(
        [*GIT, "-C", str(repo), "remote", "add", "origin", "git@github.com:pytorch/torchtitan.git"], check=True
    )
    monkeypatch.setenv("UV_NO_INDEX", "1")  # (offline: uv's own build backend needs no index)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return repo


def says(repo, broken, message):
    (repo / "torchtitan" / "broken.txt").write_text(broken)
    return commit_all(repo, message)


def nightlies(run_matrix, pytester, repo, modes, compiled=False):
    """(nightly(commit), its folder): the sentinel's run of a fake matrix of ``modes`` on one torchtitan commit of the
    checkout, whose broken.txt says which modes fail (``compiled``: the cells are aot_fx_trace ones)."""
    text = fake_matrix(modes=modes, args=', "--torchtitan-says"' + (', "--compile", "{compile}"' if compiled else ""))
    if compiled:
        text = text.replace("  ranks: [", "  compile: [aot_fx_trace]\n  ranks: [", 1)
    text = text.replace("target:\n", f'target:\n  env: {{FAKE_TORCHTITAN_SAYS: "{pytester.path / "none.txt"}"}}\n')
    folder = pytester.path / "nightly"

    def nightly(commit):
        return run_matrix(
            text,
            f"--simplefsdp-sentinel={folder}",
            f"--simplefsdp-versions=torchtitan@{commit}",
            f"--simplefsdp-torchtitan-repo={repo}",
            "--simplefsdp-confirm=2",
        )

    return nightly, folder


def test_the_sentinel_bisects_a_cell_that_turned_red_and_writes_the_issue_unattended(run_matrix, pytester, main_repo):
    repo = main_repo
    good = says(repo, "", "main, green")
    nightly, folder = nightlies(run_matrix, pytester, repo, ["pass", "regress", "always"], compiled=True)

    first = nightly(good)
    first.assert_outcomes(passed=3)
    first.stdout.fnmatch_lines(["*simplefsdp sentinel*", "the first nightly here: its outcomes are the state*"])
    state = json.loads((folder / "nightly.json").read_text())
    assert {k: v["status"] for k, v in state["cells"].items()} == {
        f"fake::{m}-aot_fx_trace-r2": "passed" for m in ("pass", "regress", "always")
    }
    harmless = says(repo, "", "harmless")
    planted = says(repo, "regress\nalways\n", "the regression")
    head = says(repo, "regress\nalways\n", "after it")
    second = nightly(head)
    second.assert_outcomes(passed=1, failed=2)
    state = json.loads((folder / "nightly.json").read_text())
    out = Path(state["run"])  # FOLDER/<time>/ of the second nightly
    assert out.parent == folder
    issues = sorted((out / "issues").iterdir())
    assert len(issues) == 1  # two cells, one signature: one bug
    body = issues[0].read_text()
    assert "(nightly: 2 cell(s) turned red)" in body and f"regressed in @{planted} (last good @{harmless})" in body
    assert f"https://github.com/pytorch/torchtitan/compare/{harmless}...{planted}" in body
    assert "## Reproducer" in body and f"regress-aot_fx_trace-r2-torchtitan-{head}" in body
    # a compiled cell's failure is bisected inside tonight's versions too: here the commit broke eager as well
    assert "**Compiler step:** fails in eager mode too: not a compiler step" in body
    assert "## Compiler bisection of `" in body and "| eager | fails | 2x fails |" in body
    draft = (out / "known_failures.draft.yaml").read_text()
    # read as YAML: a hash of digits and one `e` (5342917282e0) reads as a number, so the draft writes it quoted
    (entry,) = plain(parse_yaml(draft, "draft"))
    assert (entry["first_failing"], entry["last_passing"]) == ({"torchtitan": planted}, {"torchtitan": harmless})
    assert (entry["when"]["torchtitan_commit"], entry["link"]) == (f">={planted}", "TODO: the upstream issue")
    second.stdout.fnmatch_lines(
        [
            "*simplefsdp sentinel*",
            "2 cell(s) turned red since the last nightly (*), 1 bug(s)",
            f"bug 1: 2 cell(s), *: regressed in @{planted} (last good @{harmless})*; compiler step: fails in eager "
            "mode too: not a compiler step; issue body *",
        ]
    )
    # the state moved on: the red cells keep the versions they last passed on; a third nightly, still red, is no news
    red = state["cells"]["fake::regress-aot_fx_trace-r2"]
    assert red["status"] == "failed" and red["green"]["torchtitan_commit"] == good
    nightly(head).stdout.fnmatch_lines(["*simplefsdp sentinel*", "0 cell(s) turned red since the last nightly*"])


def test_a_cell_flaky_last_night_is_bisected_and_two_regressions_in_one_window_are_two_bugs(
    run_matrix, pytester, main_repo
):
    """Night 1 green; night 2 the cell is flaky (so it was never "passed last night" again); night 3 it fails: it
    is bisected from night 1's commit, and the window holds two regressions (one commit breaks it with another
    error, a later one with tonight's): the probes that failed otherwise are a second search, and two bugs are
    written, each at its own commit."""
    repo = main_repo
    good = says(repo, "", "main, green")
    nightly, folder = nightlies(run_matrix, pytester, repo, ["pass", "regress"])

    nightly(good).assert_outcomes(passed=2)
    shaky = says(repo, "regress flaky\n", "a flake")
    second = nightly(shaky)
    assert json.loads((folder / "nightly.json").read_text())["cells"]["fake::regress-r2"]["status"] != "passed"
    second.stdout.fnmatch_lines(["*simplefsdp sentinel*", "0 cell(s) turned red since the last nightly*"])
    first_bug = says(repo, "regress other\n", "breaks it one way")
    second_bug = says(repo, "regress\n", "breaks it another way")
    head = says(repo, "regress\n", "after them")
    third = nightly(head)
    third.stdout.fnmatch_lines(["*simplefsdp sentinel*", "1 cell(s) turned red since the last nightly (*), 2 bug(s)"])
    out = Path(json.loads((folder / "nightly.json").read_text())["run"])
    bodies = [p.read_text() for p in sorted((out / "issues").iterdir())]
    assert len(bodies) == 2
    assert any(f"regressed in @{second_bug}" in b for b in bodies), bodies
    assert any(f"regressed in @{first_bug} (last good @" in b and "another fake error" in b for b in bodies), bodies


def test_where_torch_and_torchtitan_both_moved_both_are_searched_torchtitan_first(tmp_path):
    """A night where both moved: torchtitan's commits first, then torch's releases; where only one moved, only it."""
    from pytest_simplefsdp.session.sentinel import Sentinel

    sentinel = Sentinel(None, tmp_path)
    green = {"torchtitan_commit": "aaa", "torch": "2.14.0", "torchtitan": "0.2.2"}
    assert sentinel.windows(green, {"torchtitan_commit": "bbb", "torch": "2.15.0", "torchtitan": "0.2.2"}) == [
        ("torchtitan", "aaa..bbb"),
        ("torch", "2.14.0,2.15.0"),
    ]
    assert sentinel.windows(green, {**green, "torch": "2.15.0"}) == [("torch", "2.14.0,2.15.0")]
    assert sentinel.windows(green, {**green, "torchtitan_commit": "bbb"}) == [("torchtitan", "aaa..bbb")]
    assert sentinel.windows({"torchtitan": "0.2.1"}, {"torchtitan": "0.3.0"}) == [("torchtitan", "0.2.1,0.3.0")]


def test_a_probe_failed_by_its_seed_or_baseline_is_untestable_not_another_regression():
    """A bisection probe whose seed checkpoint could not be made (its environment failed to build: seen bisecting
    main's June 2026 across `fetch`'s copy) says nothing of the cell: skipped, as git bisect skip, never the start of
    a second search for "another regression"."""
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.session.bisecting import OTHER, UNTESTABLE, outcome
    from pytest_simplefsdp.spec.cells import Cell

    cell = Cell("c", {}, 2)
    seedless = CellResult.infra(cell, "seed checkpoint for llama3 failed: no environment", culprit="seed of llama3")
    assert outcome(seedless, "RuntimeError: the bug")[0] == UNTESTABLE
    own = CellResult.infra(cell, "RuntimeError: another bug")
    assert outcome(own, "RuntimeError: the bug")[0] == OTHER
