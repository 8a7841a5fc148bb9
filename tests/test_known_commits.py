"""Known failures scoped by torchtitan commit (``torchtitan_commit: ">=X"``), decided by ancestry in a checkout: a
small fake checkout with a side branch and a mirror's ``upstream-commit:`` trailers, the real matcher and loader."""

import subprocess

import pytest

from pytest_simplefsdp.judge.known import applies, commit_scope, load_known_failures, scope_problem
from pytest_simplefsdp.spec.matrix import MatrixError
from pytest_simplefsdp.versions.git import Commit

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
UPSTREAM_FIX = "5dd944e6273f2c262afdcb3c99db89f08ef3fec1"  # upstream's hash of B, kept in B's trailer


def git(repo, *args):
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """main: A -> B (trailer: upstream's hash of B) -> C; side: a branch from A that never got B."""
    repo = tmp_path_factory.mktemp("torchtitan")
    git(repo, "init", "-q", "-b", "main")
    shas = {}
    for name, trailer in (("A", ""), ("B", f"\n\nupstream-commit: {UPSTREAM_FIX}"), ("C", "")):
        (repo / "f").write_text(name)
        git(repo, "add", "f")
        git(repo, "commit", "-qm", f"{name}{trailer}")
        shas[name] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "side", shas["A"])
    (repo / "g").write_text("side")
    git(repo, "add", "g")
    git(repo, "commit", "-qm", "side")
    shas["side"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return repo, shas


ENTRY = """\
- id: cp-refused
  when: {{cp: ">1", {scope}}}
  error: "Context Parallel requires"
  kind: xfail
  link: https://github.com/pytorch/torchtitan/pull/4218
  reason: CP needs spmd_types since upstream 5dd944e62
"""


def entry(tmp_path, scope):
    path = tmp_path / "kf.yaml"
    path.write_text(ENTRY.format(scope=scope))
    return load_known_failures(path, {"cp"}).entries[0]


def test_a_commit_range_holds_by_ancestry_in_the_checkout(checkout, tmp_path):
    """``>=`` X: X is in the commit's history (a mirror's trailer names it by upstream's hash); ``<`` X: it is not (a
    side branch that never got it included); both ends at once; an axis condition still has to hold."""
    repo, c = checkout
    since = entry(tmp_path, 'torchtitan_commit: ">=5dd944e62"')
    cp = {"cp": 2}

    def holds(e, at, axes=cp):
        return applies(e, axes, {"torchtitan": "0.2.2", "torchtitan_commit": Commit(c[at], str(repo))})

    assert [holds(since, at) for at in ("A", "B", "C", "side")] == [False, True, True, False]
    assert not holds(since, "C", {"cp": 1})
    before = entry(tmp_path, f'torchtitan_commit: "<{c["C"][:9]}"')  # fixed in C: A, B and the side branch fail
    assert [holds(before, at) for at in ("A", "B", "C", "side")] == [True, True, False, True]
    window = entry(tmp_path, f'torchtitan_commit: ">={c["B"][:12]},<{c["C"][:12]}"')
    assert [holds(window, at) for at in ("A", "B", "C", "side")] == [False, True, False, False]
    exact = entry(tmp_path, f'torchtitan_commit: "=={UPSTREAM_FIX[:9]}"')
    assert [holds(exact, at) for at in ("A", "B", "C")] == [False, True, False]


def test_a_release_decides_by_its_range_and_a_commit_by_its_own(checkout, tmp_path):
    """An entry with both ranges: the 0.3.0 wheel is judged by the release range, a checkout's commit by the commit
    range; an entry with only a commit range says nothing of a release."""
    repo, c = checkout
    both = entry(tmp_path, 'torchtitan: ">=0.3,<0.4", torchtitan_commit: ">=5dd944e62"')
    assert applies(both, {"cp": 2}, {"torchtitan": "0.3.0", "torchtitan_commit": None})
    assert not applies(both, {"cp": 2}, {"torchtitan": "0.2.2", "torchtitan_commit": None})
    assert applies(both, {"cp": 2}, {"torchtitan": "0.2.2", "torchtitan_commit": Commit(c["C"], str(repo))})
    assert not applies(both, {"cp": 2}, {"torchtitan": "0.3.0", "torchtitan_commit": Commit(c["A"], str(repo))})
    only_commit = entry(tmp_path, 'torchtitan_commit: ">=5dd944e62"')
    assert not applies(only_commit, {"cp": 2}, {"torchtitan": "0.3.0", "torchtitan_commit": None})


def test_a_release_range_under_a_commit_install_is_refused_not_matched_as_0_2_2(checkout, tmp_path):
    """main says 0.2.2 at every commit: ``torchtitan: "<0.3"`` would silently match every main commit. Under a
    commit-installed torchtitan the entry does not hold, and scope_problem says why (the session refuses to start);
    a commit the checkout lacks is named the same way."""
    repo, c = checkout
    env = {"torchtitan": "0.2.2", "torchtitan_commit": Commit(c["C"], str(repo))}
    release = entry(tmp_path, 'torchtitan: "<0.3"')
    assert not applies(release, {"cp": 2}, env)
    assert scope_problem(release, env) == (
        f"torchtitan: '<0.3' is a release range, but torchtitan here runs commit {c['C'][:12]} (its version string, "
        f"0.2.2, names no release): scope it by commit as well (torchtitan_commit: '>=<first failing commit>')"
    )
    assert scope_problem(release, {"torchtitan": "0.3.0", "torchtitan_commit": None}) is None
    unknown = entry(tmp_path, 'torchtitan_commit: ">=abcdef1234"')
    assert "abcdef1234 names no commit of" in scope_problem(unknown, env)
    assert not applies(unknown, {"cp": 2}, env)
    nowhere = {"torchtitan": "0.2.2", "torchtitan_commit": Commit(c["C"], None)}  # pip-installed from git, no clone
    assert "no checkout here holds its history (--simplefsdp-torchtitan-repo=PATH)" in scope_problem(
        entry(tmp_path, 'torchtitan_commit: ">=5dd944e62"'), nowhere
    )


@pytest.mark.parametrize(
    "scope, message",
    [
        (
            'torchtitan_commit: "newest"',
            "kf.yaml:2: entry 'cp-refused': torchtitan_commit: 'newest' is not a commit clause",
        ),
        ('torchtitan_commit: ">=5dd9"', "'>=5dd9' is not a commit clause"),
        ('torchtitan_comit: ">=5dd944e62"', "condition on unknown axis 'torchtitan_comit'"),
    ],
)
def test_a_commit_range_that_is_not_one_is_refused_with_its_line(tmp_path, scope, message):
    with pytest.raises(MatrixError, match=message.replace("(", r"\(").replace(")", r"\)")):
        entry(tmp_path, scope)


def test_a_bisections_window_over_commits_scopes_the_entry_by_commit():
    """What the update command writes into an entry a torchtitan bisection found: ``>=`` the first failing commit (a
    regression), ``<`` the fix; a window of releases gives none."""
    assert (
        commit_scope({"first_failing": {"torchtitan": "c78365232c14"}, "last_passing": {"torchtitan": "1a2b3c4d5e6f"}})
        == ">=c78365232c14"
    )
    assert commit_scope({"fixed_in": {"torchtitan": "c78365232c14"}}) == "<c78365232c14"
    assert commit_scope({"first_failing": {"torch": "2.15.0"}, "last_passing": {"torch": "2.14.1"}}) is None
    assert commit_scope({"first_failing": {"torchtitan": "0.3.0"}}) is None


def test_the_update_writes_a_commit_bisections_window_as_a_commit_scope(checkout, tmp_path):
    """A new failure whose torchtitan bisection found the window B..C (regressed in C): its drafted entry holds from C
    on, by ancestry (the side branch and B are outside it), and keeps the window's two ends."""
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.judge.update import Draft, update_file

    repo, c = checkout
    result = CellResult(
        "cp2", {"cp": 2}, status="failed", failure_class="invalid_config", error_line="boom", signature="boom"
    )
    kf = tmp_path / "kf.yaml"
    window = {"first_failing": {"torchtitan": c["C"][:12]}, "last_passing": {"torchtitan": c["B"][:12]}}
    update_file(
        kf,
        [Draft("p", [result], [("cp", 2)])],
        set(),
        "2026-12-05",
        windows={"p-cp2": window},
        check=lambda p: load_known_failures(p, {"cp"}),
    )
    text = kf.read_text()
    assert f"when: {{profile: p, cp: 2, torchtitan_commit: '>={c['C'][:12]}'}}" in text, text
    (drafted,) = load_known_failures(kf, {"cp"}).entries
    env = lambda at: {"profile": "p", "torchtitan_commit": Commit(c[at], str(repo))}  # noqa: E731
    assert [applies(drafted, {"cp": 2}, env(at)) for at in ("A", "B", "C", "side")] == [False, False, True, False]
