"""--simplefsdp-changed: the cells a torchtitan checkout's changes can reach, by the target's map of paths
(matrix/paths/<target>.yaml), on a fake checkout and the CPU profile's dry run (no rank starts)."""

import re
import subprocess

import pytest

from pytest_simplefsdp.spec.footprint import FileChange, Footprint
from pytest_simplefsdp.spec.paths import load_rules, map_file, select
from pytest_simplefsdp.store import footprints
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
            f"{dsv3} of {total} cells of matrix/cpu.yaml, by the map of torchtitan paths (no footprints kept: "
            f"--simplefsdp-footprint makes them); {total - dsv3} left out",
            "    README.md: no cell (documentation; *titan03.yaml:*)",
            f"    {DSV3}: model=deepseek_v3 cells (graph_trainer's deepseek_v3; *titan03.yaml:*)",
            "    torchtitan.egg-info/PKG-INFO: no cell (pip's metadata*",
            "    torchtitan/__pycache__/trainer.cpython-311.pyc: no cell (Python's bytecode cache*",
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
            f"({base}) reach 0 of * cells of matrix/cpu.yaml, by the map*; * left out"
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
    changes = [FileChange(p, p, True) for p in ("torchtitan/experiments/graph_trainer/graph_pp/runner.py", "docs/x.md")]
    chosen = select(rules, changes)
    assert chosen.reaches("a", {"model": "llama3", "pp": 2}) and chosen.reaches("b", {"model": "llama3", "pp": 1})
    model = select(rules, [FileChange(p, p, True) for p in ("torchtitan/models/llama3/model.py",)])
    assert model.reaches("a", {"model": "llama3"}) and not model.reaches("b", {"model": "deepseek_v3"})
    bad = tmp_path / "map.yaml"
    bad.write_text(
        "rules:\n  - {path: 'a/*', reaches: none, why: fine}\n  - {path: 'b/*', reaches: {pipeline: 2}, why: typo}\n"
    )
    with pytest.raises(MatrixError, match=r"map.yaml:3: rule 'b/\*': unknown axis 'pipeline'"):
        load_rules(bad, Titan03.AXES)
    bad.write_text("rules:\n  - {path: 'a/*', reaches: some}\n")
    with pytest.raises(MatrixError, match=r"map.yaml:2: a rule is \{path: GLOB, reaches: .*got \{'path': 'a/\*'"):
        load_rules(bad, Titan03.AXES)


# --- selection by footprints --------------------------------------------------------------------------------------

TRAINER = "torchtitan/trainer.py"
TRAINER_CODE = "def train_step(x):\n    return x + 1\n\n\ndef checkpoint(x):\n    return x\n\n\ndef unused_helper(x):\n    return x\n"
ASSETS = "tests/assets/tokenizer/tokenizer.json"


@pytest.fixture
def traced(pytester, checkout):
    """The fake checkout with a trainer and assets, committed, and footprints kept for that commit as the nightly
    would keep them: every cell ran train_step and read the tokenizer; only llama3's cells ran checkpoint."""
    repo, _ = checkout
    (repo / TRAINER).write_text(TRAINER_CODE)
    (repo / ASSETS).parent.mkdir(parents=True)
    (repo / ASSETS).write_text("{}")
    base = commit_all(repo, "the trainer")
    full = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    every = dry_run(pytester, repo)
    cells = sorted(selected(every))
    for cell in cells:
        ran = {"<module>", "train_step"} | ({"checkpoint"} if cell.startswith("llama3") else set())
        fp = Footprint(
            frozenset({TRAINER, DSV3}), {TRAINER: frozenset(ran)}, trees=frozenset({"tests/assets/tokenizer"})
        )
        footprints.save(pytester.path / ".simplefsdp", full, "cpu", cell, fp, {"torchtitan": "fake"})
    return repo, base, cells


def edit_line(repo, path, old, new):
    text = (repo / path).read_text()
    assert old in text
    (repo / path).write_text(text.replace(old, new))


def selected(result):
    return set(re.findall(r"cpu\.yaml::(\S+) SKIPPED", result.stdout.str()))


def test_footprints_select_the_cells_that_ran_the_changed_function(pytester, traced):
    """A changed function selects the cells that ran it, whatever the map says of its file (the trainer: every
    cell); the header says the footprints decided."""
    repo, base, cells = traced
    edit_line(repo, TRAINER, "def checkpoint(x):\n    return x", "def checkpoint(x):\n    return x + 0")
    result = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    llama = {c for c in cells if c.startswith("llama3")}
    assert selected(result) == llama and 0 < len(llama) < len(cells)
    result.stdout.fnmatch_lines(
        [
            f"simplefsdp: --simplefsdp-changed: 1 file changed since {base} ({base}) reach {len(llama)} of "
            f"{len(cells)} cells of matrix/cpu.yaml, by what {len(cells)} of its cells ran at {base} (the map for "
            f"the rest); * left out",
            f"    {TRAINER}: {len(llama)} cells ran it (changed in checkpoint)",
        ]
    )


def test_a_changed_function_no_cell_ran_selects_none_and_is_not_gated_here(pytester, traced):
    """The map alone would run every cell for the trainer; its footprints show no cell ran the function: none
    runs, and the run says the change is not gated here (exit 5: no tests ran), not that it passed."""
    repo, base, _ = traced
    edit_line(repo, TRAINER, "def unused_helper(x):\n    return x", "def unused_helper(x):\n    return x * 2")
    result = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    assert selected(result) == set()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(
        [
            f"simplefsdp: NOT GATED HERE: 1 changed file reach no cell of matrix/cpu.yaml: {TRAINER}: no cell of "
            f"this profile ran it (changed in unused_helper; footprints of * cells, made at *)*",
        ]
    )


def test_a_renamed_file_is_selected_at_its_old_name(pytester, traced):
    """git lists a rename at its new name; the cells that ran the old one run."""
    repo, base, cells = traced
    subprocess.run([*GIT, "-C", str(repo), "mv", TRAINER, "torchtitan/train_loop.py"], check=True)
    result = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    assert selected(result) == set(cells)
    result.stdout.fnmatch_lines([f"    torchtitan/train_loop.py: {len(cells)} cells ran it (renamed from {TRAINER})"])


def test_a_change_to_the_test_assets_selects_every_cell_that_reads_them(pytester, traced, checkout):
    """tests/assets is what every cell trains on: by the footprints (the tokenizer the command names) and, where no
    footprint is kept, by the map (tests/assets reaches every cell; it said none before)."""
    repo, base, cells = traced
    (repo / ASSETS).write_text('{"changed": true}')
    assert selected(dry_run(pytester, repo, f"--simplefsdp-changed={base}")) == set(cells)
    import shutil

    shutil.rmtree(pytester.path / ".simplefsdp" / "footprints")
    by_map = dry_run(pytester, repo, f"--simplefsdp-changed={base}")
    assert selected(by_map) == set(cells)
    by_map.stdout.fnmatch_lines([f"    {ASSETS}: all cells (the tokenizer and c4 sample*"])


def test_footprints_of_an_older_commit_are_used_with_the_diff_taken_from_there(pytester, traced):
    """The PR's base is newer than the nightly's footprints: the diff is taken from the footprints' commit, so a
    change that landed in between counts too (sound for what the cells ran)."""
    repo, base, cells = traced
    edit_line(repo, TRAINER, "def checkpoint(x):\n    return x", "def checkpoint(x):\n    return x + 0")
    newer = commit_all(repo, "landed after the nightly")
    result = dry_run(pytester, repo, f"--simplefsdp-changed={newer}")  # the PR itself changes nothing
    assert selected(result) == {c for c in cells if c.startswith("llama3")}
    result.stdout.fnmatch_lines(
        [f"*changed since {newer} ({newer}) (and since {base}, where its footprints were made)*"]
    )


def test_the_footprint_against_the_map():
    """A footprint that contradicts the map is named (a file a cell ran that its rule says cannot reach it)."""
    from pytest_simplefsdp.spec.paths import contradictions
    from pytest_simplefsdp.targets.titan03 import Titan03

    rules = load_rules(map_file("titan03"), Titan03.AXES)
    fp = Footprint(frozenset({"torchtitan/models/deepseek_v3/model.py", "tests/assets/c4_test/x", "docs/a.md"}))
    found = contradictions(rules, {"llama3-dp2-eager": fp}, {"llama3-dp2-eager": {"model": "llama3", "pp": 1}})
    at = {r.path: r.where for r in rules}
    assert found == [
        f"llama3-dp2-eager ran docs/a.md, which {at['*.md']} maps to no cell (documentation)",
        "llama3-dp2-eager ran torchtitan/models/deepseek_v3/model.py, which "
        f"{at['torchtitan/models/deepseek_v3/*']} maps to model=deepseek_v3 cells (the deepseek_v3 model)",
    ]
