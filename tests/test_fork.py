"""The fork launcher: same verdicts and losses as the other launchers, no orphans, fallback."""

import json

import pytest

from conftest import FAKE_RANK, fake_matrix, marked


def module_matrix(modes, **kw):
    """The fake rank as `python -m fake_rank`, the form the fork server can preload and fork."""
    text = fake_matrix(modes=modes, **kw).replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"')
    return text.replace("target:\n", "target:\n  env: {PYTHONPATH: \"%s\"}\n" % FAKE_RANK.parent)


@pytest.mark.parametrize("launcher", ["fork", "local"])
def test_fork_gives_the_same_verdicts_as_local(run_matrix, pytester, launcher):
    out = pytester.path / f"{launcher}.json"
    result = run_matrix(module_matrix(["pass", "fail", "segv", "exit3", "hang", "noresult"], timeout=5),
                        f"--simplefsdp-json={out}", launcher=launcher)
    result.assert_outcomes(passed=1, failed=5)
    cells = {c["id"]: c for c in json.loads(out.read_text())["runs"][0]["cells"]}
    got = {cid: (c["failure_class"], c["failing_rank"]) for cid, c in cells.items()}
    assert got == {"pass-r2": (None, None), "fail-r2": ("runtime", 1), "segv-r2": ("crash", 1),
                   "exit3-r2": ("runtime", 1), "hang-r2": ("hang", 0), "noresult-r2": ("no_result", None)}
    assert cells["pass-r2"]["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    assert "Current thread" in open(cells["hang-r2"]["rank_logs"]["1"][0]).read()  # stacks dumped
    for cid in cells:
        assert not marked(cid)
    assert not marked("forkserver:")


def test_fork_falls_back_for_scripts_and_says_so(run_matrix):
    result = run_matrix(fake_matrix(modes=["fail"]), launcher="fork")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fork launcher: not a `python -m module` program of this interpreter; "
                                 "ran under the local launcher*"])
