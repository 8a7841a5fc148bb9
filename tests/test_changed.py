"""--simplefsdp-changed: the cells a torchtitan checkout's changes can reach, by the target's map of paths
(matrix/paths/<target>.yaml), on a fake checkout and the CPU profile's dry run (no rank starts)."""

import re
import subprocess

import pytest

from pytest_simplefsdp.spec.paths import load_rules, map_file, select
from pytest_simplefsdp.yamlio import MatrixError

from helpers import GIT, commit_all

pytestmark = pytest.mark.fake

DSV3 = "torchtitan/experiments/graph_trainer/deepseek_v3/parallelize.py"


@pytest.fixture
def checkout(tmp_path):
    """A fake torchtitan checkout with one commit (returned with it): the files the map names, as placeholders."""
    repo = tmp_path / "torchtitan-checkout"
    for path in (DSV3, "torchtitan/trainer.py", "README.md", "torchtitan/experiments/rl/actor.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("# placeholder\n")
    subprocess.run([*GIT, "init", "-q", "-b", "main", str(repo)], check=True)
    return repo, commit_all(repo, "the base")


def dry_run(pytester, repo, *args):
    return pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "--simplefsdp-dry-run",
        f"--simplefsdp-torchtitan-repo={repo}",
        *args,
    )


def test_a_change_runs_only_the_cells_it_can_reach(pytester, checkout):
    """The deepseek_v3 folder of graph_trainer reaches deepseek_v3's cells; a README and another experiment none; a
    file the map does not know (the trainer) reaches every cell. Uncommitted edits and new files count."""
    repo, base = checkout
    every = dry_run(pytester, repo)
    total = every.parseoutcomes()["skipped"]
    dsv3 = len(set(re.findall(r"cpu\.yaml::(deepseek_v3-\S+)  \[", every.stdout.str())))
    assert 0 < dsv3 < total
    (repo / DSV3).write_text("# the PR's edit\n")
    (repo / "README.md").write_text("# docs\n")
    (repo / "torchtitan/experiments/rl/new_file.py").write_text("")  # untracked: counts as changed
    for built in ("torchtitan.egg-info/PKG-INFO", "torchtitan/__pycache__/trainer.cpython-311.pyc"):
        (repo / built).parent.mkdir(exist_ok=True)  # an editable install's files where no .gitignore hides them
        (repo / built).write_text("")
    model = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    assert model.parseoutcomes() == {"skipped": dsv3, "deselected": total - dsv3}, model.stdout.str()[-3000:]
    model.stdout.fnmatch_lines(
        [
            f"simplefsdp: --simplefsdp-changed: 5 files changed since {base} ({base}) reach "
            f"{dsv3} of {total} cells of matrix/cpu.yaml; {total - dsv3} left out",
            "    README.md: no cell (documentation; *titan03.yaml:*)",
            "    torchtitan.egg-info/PKG-INFO: no cell (pip's metadata*",
            "    torchtitan/__pycache__/trainer.cpython-311.pyc: no cell (Python's bytecode cache*",
            f"    {DSV3}: model=deepseek_v3 cells (graph_trainer's deepseek_v3; *titan03.yaml:*)",
            "    torchtitan/experiments/rl/new_file.py: no cell (another experiment*",
        ]
    )
    commit_all(repo, "the pull request")
    (repo / "torchtitan/trainer.py").write_text("# the core trainer\n")
    wide = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    assert wide.parseoutcomes() == {"skipped": total}
    wide.stdout.fnmatch_lines(["    torchtitan/trainer.py: no rule maps it: every cell (the safe default)"])


def test_a_change_no_cell_can_reach_passes_the_gate_with_nothing_run(pytester, checkout):
    repo, base = checkout
    (repo / "README.md").write_text("# docs only\n")
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-qb", "docs"], check=True)
    commit_all(repo, "docs")
    result = dry_run(pytester, repo, "--simplefsdp-changed")  # bare: the merge base of HEAD with main
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            f"simplefsdp: --simplefsdp-changed: 1 file changed since merge-base(HEAD, main) "
            f"({base}) reach 0 of * cells of matrix/cpu.yaml; * left out"
        ]
    )
    bad = dry_run(pytester, repo, "--simplefsdp-changed=no-such-ref")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--simplefsdp-changed=no-such-ref: git rev-parse*no-such-ref*"])


def test_the_shipped_maps_load_and_a_bad_rule_names_its_line(tmp_path):
    from pytest_simplefsdp.targets.titan03 import Titan03

    for name in ("titan03", "titan02"):
        assert load_rules(map_file(name), Titan03.AXES)
    rules = load_rules(map_file("titan03"), Titan03.AXES)
    chosen = select(rules, ["torchtitan/experiments/graph_trainer/graph_pp/runner.py", "docs/x.md"])
    assert chosen.reaches({"model": "llama3", "pp": 2}) and not chosen.reaches({"model": "llama3", "pp": 1})
    bad = tmp_path / "map.yaml"
    bad.write_text(
        "rules:\n  - {path: 'a/*', reaches: none, why: fine}\n  - {path: 'b/*', reaches: {pipeline: 2}, why: typo}\n"
    )
    with pytest.raises(MatrixError, match=r"map.yaml:3: rule 'b/\*': unknown axis 'pipeline'"):
        load_rules(bad, Titan03.AXES)
    bad.write_text("rules:\n  - {path: 'a/*', reaches: some}\n")
    with pytest.raises(MatrixError, match=r"map.yaml:2: a rule is \{path: GLOB, reaches: .*got \{'path': 'a/\*'"):
        load_rules(bad, Titan03.AXES)
