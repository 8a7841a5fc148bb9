"""The main tier (tox -e main): torchtitan main, the head of the bundle of its newest commits, installed editable from
a clone (tests/main_checkout.py), on torch 2.14.1. Its smoke cells run there as on 0.3.0 (the grain dataloader's
dataset set through the config module), and a pull request on top of it is gated against its base for real."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_simplefsdp.machine import source_checkout
from pytest_simplefsdp.spec.paths import contradictions, load_rules, map_file
from pytest_simplefsdp.store import footprints
from pytest_simplefsdp.targets.titan03 import Titan03
from pytest_simplefsdp.yamlio import load_yaml, plain

from helpers import GIT, PLANT_EP, PLANT_EP_OTHER, PLANT_EPS, PLANT_TRACE, cells_of, plant, plant_in_history

CHECKOUT = Path(os.environ.get("SIMPLEFSDP_MAIN_CHECKOUT", "/nonexistent"))
ELSEWHERE = source_checkout("torchtitan") is None or source_checkout("torchtitan").resolve() != CHECKOUT.resolve()

# skipped per test, not the module: a module skip collects nothing, and pytest exits 5 (tox -e main without a bundle)
pytestmark = [
    pytest.mark.real,
    pytest.mark.main,
    pytest.mark.skipif(
        ELSEWHERE,
        reason="the main tier runs on torchtitan main installed editable from "
        "$SIMPLEFSDP_MAIN_CHECKOUT (tox -e main, which clones the bundle)",
    ),
]


def run_smoke(pytester, *args, timeout=1500):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-m",
        "smoke",
        "-v",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        *args,
        timeout=timeout,
    )
    return result, out


def test_the_smoke_cells_pass_on_torchtitan_main(pytester):
    """...and keep their footprints (what they ran of main), which agree with the hand-written path map: a file a
    cell ran is never one the map says cannot reach it (a map rule that is wrong fails here, on real main)."""
    result, out = run_smoke(pytester, "--simplefsdp-footprint")
    result.assert_outcomes(passed=3)
    commit = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True)
    prints = footprints.load(pytester.path / ".simplefsdp", commit.stdout.strip(), "cpu")
    assert set(prints) >= set(cells_of(out)), sorted(prints)
    rules = load_rules(map_file("titan03"), Titan03.AXES)
    axes = {cid: rec["axes"] for cid, rec in cells_of(out).items()}
    assert contradictions(rules, {c: prints[c] for c in axes}, axes) == []
    trainer = prints["llama3-dp2-eager"].functions["torchtitan/trainer.py"]
    assert "Trainer.train_step" in trainer and "Trainer.forward_backward_step" in trainer
    cells = cells_of(out)
    for cell in cells.values():
        command = (Path(cell["log_dir"]) / "command.txt").read_text()
        # main has no --dataloader.dataset_path: the config module sets the grain dataset (upstream 1460458)
        assert "--dataloader.dataset_path" not in command and "SIMPLEFSDP_CONFIG_SET=" in command
        assert "--training.max_context_length 256" in command  # (PR 4121's names, spelled from main's config)
        assert cell["losses"]["3"] < cell["losses"]["1"]
    assert cells["llama3-dp2-aot_fx_trace-mp_default"]["numerics"]["max_abs_diff"] == 0  # tracing changes no bit


@pytest.fixture
def pr_branch():
    """A base one commit past main's head that breaks EP, and a PR on it that breaks aot_fx_trace on llama3,
    checked out in the editable clone (so the installed torchtitan is the PR); the clone's HEAD is restored after."""
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--abbrev-ref", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()  # (main: the clone's branch)
    try:
        base = plant(CHECKOUT, PLANT_EP, branch="gate-demo-base")
        pr = plant(CHECKOUT, PLANT_TRACE, branch="gate-demo-pr")
        yield base, pr
    finally:
        subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-qf", head], check=True)
        subprocess.run([*GIT, "-C", str(CHECKOUT), "branch", "-qD", "gate-demo-base", "gate-demo-pr"], check=False)


def test_a_pr_that_moves_every_layouts_numerics_is_reported_against_its_base(pytester):
    """RMSNorm's eps 1e-5 -> 1e-3 moves every cell and its baseline alike: llama3's two smoke layouts each pass
    their baseline (the traced cell's is the eager one, which moved too), and only the same cell on the base shows
    the change (--simplefsdp-base-numerics, report by default: the gate passes). (deepseek_v3's smoke cell is left
    out: the same mechanism, with its baseline and seed made on both sides, cost a third of the test.)"""
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--abbrev-ref", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    start = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        plant(CHECKOUT, PLANT_EPS, branch="eps-demo-pr", replace=True)
        result, out = run_smoke(
            pytester,
            f"--simplefsdp-base={start}",
            f"--simplefsdp-torchtitan-repo={CHECKOUT}",
            "-k",
            "llama3 and not spmd_types",
            timeout=2400,
        )
        result.assert_outcomes(passed=2)
        for cell in cells_of(out).values():
            moved = cell["base_numerics"]
            assert moved["changed"] and moved["beyond"] and moved["size"]["loss"] > 1e-6, (cell["id"], moved)
            assert cell["numerics"]["max_rel_diff"] <= 1e-4, cell["numerics"]  # its own baseline moved with it
        result.stdout.fnmatch_lines(
            [
                "numerics vs the base: 2 of 2 passing smoke cell(s) compared changed",
                "*llama3-dp2-eager: numerics changed vs the base*: largest relative change loss *",
            ]
        )
        assert result.ret == pytest.ExitCode.OK
        # (under --simplefsdp-base-numerics=fail the moved cells fail as new: tests/test_gate.py, fake ranks)
    finally:
        subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-qf", head], check=True)
        subprocess.run([*GIT, "-C", str(CHECKOUT), "branch", "-qD", "eps-demo-pr"], check=False)


# --- from inside the checkout, as the README's gate runs (issue 45): the base, a twin's other side and each bisection
# probe must run their own commit's torchtitan, not the checkout the run starts in

PYTEST = Path(sys.executable).parent / "pytest"  # the console script, as the README's commands run it

EP_ONLY = textwrap.dedent("""\
    profile: ep-only
    description: the EP cell of the CPU profile, without numerics (a twin's and a bisection's probes in minutes)
    target: titan03
    device: cpu
    world_sizes: [2]
    degrees: [dp_shard]
    timeout: 600
    settings: {steps: 3, seq_len: 256, local_batch_size: 2, seed: 42}
    models:
      deepseek_v3: {moe: true, module: titan03_configs, config: deepseek_v3_debugmodel_cpu}
    axes: {model: [deepseek_v3], dp_shard: [2], ep: [2], compile: [eager]}
    ids: {dp_shard: {prefix: dp}, ep: {prefix: ep}}
    """)


@pytest.fixture
def ep_pr():
    """Issue 45's planted PR: a base one commit past main's head that refuses EP (RuntimeError), and a PR on it that
    refuses it with another error (ValueError), checked out in the editable clone; HEAD restored after."""
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--abbrev-ref", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    start = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        base = plant(CHECKOUT, PLANT_EP, branch="ep-demo-base")
        pr = plant(CHECKOUT, PLANT_EP_OTHER, branch="ep-demo-pr", replace=True)
        yield start, base, pr
    finally:
        subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-qf", head], check=True)
        subprocess.run([*GIT, "-C", str(CHECKOUT), "branch", "-qD", "ep-demo-base", "ep-demo-pr"], check=False)


def in_checkout(tmp_path, *args, timeout=2400):
    """pytest as a user runs it in their torchtitan checkout: its root the working folder (and the rootdir)."""
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [
            str(PYTEST),
            "--simplefsdp-matrix",
            f"--simplefsdp-json={out}",
            "-rA",
            f"--simplefsdp-artifacts={tmp_path / 'runs'}",
            "--simplefsdp-confirm=1",
            *map(str, args),
        ],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, out


REFUSED, OTHER = "RuntimeError: planted: expert parallelism refused", "ValueError: expert parallel all-to-all"


def test_the_readme_gate_run_in_the_checkout_gates_a_pr_on_main_against_its_base(tmp_path, pr_branch):
    """The README's gate, word for word from the checkout's root, on a PR on main: llama3 eager passes (not rerun);
    llama3 aot_fx_trace fails here and passes on the base: new; deepseek_v3 EP fails on both with the same
    signature: broken trunk. One new failure: the gate fails. The base's ranks run the base's own torchtitan (its
    environment), not the PR's working tree the run starts in: had they imported the PR's, the traced cell would
    fail there too, with the PR's error, and pass as broken trunk (as it once did)."""
    base, _ = pr_branch
    proc, out = in_checkout(tmp_path, "--simplefsdp-profile=cpu", "-m", "smoke", "--simplefsdp-base=gate-demo-base")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    cells = cells_of(out)
    assert cells["llama3-dp2-eager"].get("gate") is None
    new, trunk = cells["llama3-dp2-aot_fx_trace-mp_default"], cells["deepseek_v3-dp2-ep2-eager"]
    assert new["gate"] == "new" and new["base"]["passed"] == new["base"]["runs"] == 1, new
    assert "planted: aot_fx_trace refused for llama3" in new["error_line"]
    assert trunk["gate"] == "broken trunk" and trunk["base"]["signatures"] == [trunk["signature"]]
    # the identity: the error and where it was raised (issue 58: broken trunk compares both)
    assert trunk["signature"] == f"{REFUSED} @ {PLANT_EP[0]}:parallelize_deepseekv3", trunk["signature"]
    proof = json.loads((Path(new["base"]["folders"][0]) / "evidence" / "rank0.json").read_text())["imported"]
    assert proof["torchtitan"]["commit"].startswith(base) and "/.simplefsdp/envs/" in proof["torchtitan"]["file"]
    assert json.loads(out.read_text())["gate"]["counts"] == {"new": 1, "broken trunk": 1, "flaky": 0, "known": 0}
    assert f"simplefsdp PR gate against base gate-demo-base ({base}): 1 new, 1 broken trunk" in proc.stdout
    # (issue 58: the same failure with a flaky past is still new when it fails every run its past asks for:
    # tests/test_history.py, on the same gate and history store, with fake ranks)


def test_a_twin_run_in_the_checkout_runs_its_other_side_on_that_commit(tmp_path, ep_pr):
    _, base, _ = ep_pr
    matrix = tmp_path / "ep.yaml"
    matrix.write_text(EP_ONLY)
    proc, out = in_checkout(tmp_path, f"--simplefsdp-matrix-file={matrix}", f"--simplefsdp-twin=torchtitan@{base}")
    cells = cells_of(out)
    assert cells["deepseek_v3-dp2-ep2-eager"]["error_line"].startswith(OTHER), proc.stdout[-3000:]
    twin = cells[f"deepseek_v3-dp2-ep2-eager-torchtitan-{base}"]
    assert twin["error_line"] == REFUSED and twin["imported"]["torchtitan"]["commit"].startswith(base), twin


def test_a_bisection_in_the_checkout_probes_each_commit(tmp_path, ep_pr):
    """main's head passes, the base refuses EP, the PR refuses it another way: the PR's error came with the PR.
    The checkout holds the base: every probe that imported it would fail with the base's error."""
    start, base, pr = ep_pr
    subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-q", "ep-demo-base"], check=True)
    matrix = tmp_path / "ep.yaml"
    matrix.write_text(EP_ONLY)
    proc, out = in_checkout(
        tmp_path,
        f"--simplefsdp-matrix-file={matrix}",
        f"--simplefsdp-versions=torchtitan@{pr}",
        "--simplefsdp-bisect=torchtitan",
        f"--simplefsdp-bisect-versions={start}..{pr}",
    )
    found, second = json.loads(out.read_text())["bisections"]
    outcomes = {p["version"]: p["outcome"] for p in found["probes"]}
    assert found["window"] == [f"@{start}", f"@{pr}"], found  # (the base fails otherwise: skipped, as git bisect skip)
    assert outcomes == {f"@{start}": "passes", f"@{base}": "other", f"@{pr}": "fails"}, outcomes
    # the base's own error met on the way is a regression of its own, searched for by its signature (issue 59)
    assert second["second_regression"].startswith(REFUSED) and second["window"] == [f"@{start}", f"@{base}"], second


# --- issue 46: all of the matrix on main: upstream's suite, the GPU profiles' trace tier, entries scoped by commit,
# the SPMD backend axis


def test_upstreams_suite_lists_its_cells_on_main(pytester):
    """Upstream's own suite on main: its configs take the dataset only in Python (grain), which the rank shim sets on
    whichever config a cell loads; before, the profile stopped before any cell ("needs --dataloader.dataset_path")."""
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", "--simplefsdp-profile=upstream", "--simplefsdp-dry-run"
    )
    assert result.ret == 0, result.stdout.str()[-3000:] + result.stderr.str()[-2000:]
    result.stdout.fnmatch_lines(["*upstream.yaml: 39 valid cells, 0 n/a*"])
    assert "SIMPLEFSDP_CONFIG_SET=" in result.stdout.str() and "--dataloader.dataset_path" not in result.stdout.str()


def test_trace_cells_on_main_pass_or_fail_as_their_commit_scoped_entry(pytester):
    """A few cells of the GPU profiles' trace tier on main: plain FSDP and an upstream test pass; a CP layout and
    upstream's CP test (which the trace tier runs since the shim serves CP's CPU attention) fail as upstream
    5dd944e62 (#4218) made them, matched by the entry scoped `torchtitan_commit: ">=5dd944e62"` (the clone's commit of
    it carries upstream's hash in its trailer: decided by ancestry)."""
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=h100x8,upstream",
        "--simplefsdp-tier=trace",
        "-k",
        "llama3-dp8-aot_fx_trace-mp_default or deepseek_v3-dp2-cp2-tp2-eager or "
        "(aot_fx_trace_llama3_fsdp_tp and not inductor)",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        "-rA",
        timeout=1500,
    )
    result.assert_outcomes(passed=2, xfailed=2)
    upstream = cells_of(out, 1)
    for cp in (cells_of(out)["deepseek_v3-dp2-cp2-tp2-eager"], upstream["aot_fx_trace_llama3_fsdp_tp_cp"]):
        assert cp["known_failure"] == "main-graph-trainer-cp-needs-spmd-types", cp
        assert "Context Parallel requires parallelism.spmd_backend='spmd_types'" in cp["error_line"]
    assert upstream["aot_fx_trace_llama3_fsdp_tp"]["status"] == "passed", upstream


def test_a_release_range_is_refused_where_torchtitan_runs_a_commit(pytester):
    """main says 0.2.2 at every commit: an entry scoped `torchtitan: "<0.3"` would match all of main. It is refused at
    start, naming its line and the commit; the same entry scoped by commit loads."""
    kf = pytester.path / "kf.yaml"
    entry = (
        "- id: old-release\n  when: {{profile: cpu, model: llama3, {scope}}}\n  error: boom\n  kind: xfail\n"
        "  link: https://github.com/pytorch/torchtitan/pull/4218\n  reason: scoped by a release range\n"
    )
    kf.write_text(entry.format(scope='torchtitan: "<0.3"'))
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "--simplefsdp-dry-run",
        f"--simplefsdp-known-failures={kf}",
        "-m",
        "smoke",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*kf.yaml:1: entry 'old-release': torchtitan: '<0.3' is a release range, but "
            "torchtitan here runs commit * (its version string, 0.2.2, names no release)*"
        ]
    )
    kf.write_text(entry.format(scope='torchtitan_commit: ">=5dd944e62"'))
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "--simplefsdp-dry-run",
        f"--simplefsdp-known-failures={kf}",
        "-m",
        "smoke",
    )
    assert result.ret == 0, result.stderr.str()[-2000:]


def test_each_spmd_backend_has_a_cpu_cell_on_main(pytester):
    """The spmd_backend axis on main (which offers partial_dtensor and spmd_types): the partial_dtensor cell passes with
    the backend its run used as evidence; SimpleFSDP under spmd_types fails as its known failure (no `fsdp` mesh)."""
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-k",
        "llama3-dp2-eager and not fsdp2",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        "-rA",
        timeout=1500,
    )
    result.assert_outcomes(passed=1, xfailed=1)
    cells = cells_of(out)
    seen = {e["axis"]: e for e in cells["llama3-dp2-eager"]["evidence"]}
    assert seen["spmd_backend=partial_dtensor"]["ok"] and seen["spmd_backend=partial_dtensor"]["seen"] == (
        "partial_dtensor on ranks 0, 1"
    )
    assert cells["llama3-dp2-eager-spmd_types"]["known_failure"] == "simplefsdp-spmd-types-no-fsdp-mesh"


# --- issue 49: the nightly sentinel on main, unattended


@pytest.fixture
def planted_main():
    """main's history with a regression planted three commits before its head (EP refused; the later commits
    cherry-picked on top, branch ``sentinel-demo``): (the commit before it, the planted commit, the new head)."""
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--abbrev-ref", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    before = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD~3"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        planted, tip = plant_in_history(CHECKOUT, before, PLANT_EP, branch="sentinel-demo")
        yield before, planted, tip
    finally:
        subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-qf", head], check=True)
        subprocess.run([*GIT, "-C", str(CHECKOUT), "branch", "-qD", "sentinel-demo"], check=False)


def test_the_sentinel_on_main_finds_the_planted_commit_unattended(tmp_path, planted_main):
    """Two nightlies, the same command each night: the first on main before the regression (green), the second on
    the new head. The second confirms the red cell, bisects the torchtitan commits since it last passed and writes
    the issue body naming the planted commit, and the known-failures draft with its window."""
    before, planted, tip = planted_main
    matrix, folder = tmp_path / "ep.yaml", tmp_path / "nightly"
    matrix.write_text(EP_ONLY)
    nights = []
    for n, commit in enumerate((before, tip)):
        proc, _ = in_checkout(
            tmp_path / f"night{n}",
            f"--simplefsdp-matrix-file={matrix}",
            f"--simplefsdp-sentinel={folder}",
            f"--simplefsdp-versions=torchtitan@{commit}",
        )
        nights.append(proc)
    assert nights[0].returncode == 0, nights[0].stdout[-3000:] + nights[0].stderr[-2000:]
    assert nights[1].returncode == 1 and "1 cell(s) turned red since the last nightly" in nights[1].stdout, (
        nights[1].stdout[-4000:] + nights[1].stderr[-2000:]
    )
    out = Path(json.loads((folder / "nightly.json").read_text())["run"])
    (issue,) = (out / "issues").iterdir()
    body = issue.read_text()
    assert f"regressed in @{planted}" in body and REFUSED in body, body[:3000]
    assert f"--simplefsdp-versions=torchtitan@{planted}" in body  # the reproducer pins the failing commit
    draft = plain(load_yaml(out / "known_failures.draft.yaml"))  # (a hash like 37e751171312 is written quoted)
    assert [e["first_failing"] for e in draft] == [{"torchtitan": planted}], draft
