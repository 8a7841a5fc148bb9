"""The main tier (tox -e main): torchtitan main, the head of the bundle of its newest commits, installed editable from
a clone (tests/main_checkout.py), on torch 2.14.1. Its smoke cells run there as on 0.3.0 (the grain dataloader's
dataset set through the config module), and a pull request on top of it is gated against its base for real."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import GIT, PLANT_EP, PLANT_TRACE, cells_of, plant
from pytest_simplefsdp.machine import source_checkout

CHECKOUT = Path(os.environ.get("SIMPLEFSDP_MAIN_CHECKOUT", "/nonexistent"))
ELSEWHERE = source_checkout("torchtitan") is None or source_checkout("torchtitan").resolve() != CHECKOUT.resolve()

# skipped per test, not the module: a module skip collects nothing, and pytest exits 5 (tox -e main without a bundle)
pytestmark = [pytest.mark.real, pytest.mark.main,
              pytest.mark.skipif(ELSEWHERE, reason="the main tier runs on torchtitan main installed editable from "
                                 "$SIMPLEFSDP_MAIN_CHECKOUT (tox -e main, which clones the bundle)")]


def run_smoke(pytester, *args, timeout=1500):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-profile=cpu", "-m", "smoke", "-v",
                                           f"--simplefsdp-json={out}", f"--simplefsdp-artifacts={pytester.path / 'runs'}",
                                           *args, timeout=timeout)
    return result, out


def test_the_smoke_cells_pass_on_torchtitan_main(pytester):
    result, out = run_smoke(pytester)
    result.assert_outcomes(passed=3)
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
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--abbrev-ref", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()  # (main: the clone's branch)
    try:
        base = plant(CHECKOUT, PLANT_EP, branch="gate-demo-base")
        pr = plant(CHECKOUT, PLANT_TRACE, branch="gate-demo-pr")
        yield base, pr
    finally:
        subprocess.run([*GIT, "-C", str(CHECKOUT), "checkout", "-qf", head], check=True)
        subprocess.run([*GIT, "-C", str(CHECKOUT), "branch", "-qD", "gate-demo-base", "gate-demo-pr"], check=False)


def test_a_pr_on_main_is_gated_against_its_base(pytester, pr_branch):
    """llama3 eager passes (not rerun); llama3 aot_fx_trace fails here and passes on the base: new; deepseek_v3 EP
    fails on both with the same signature: broken trunk. One new failure: the gate fails."""
    base, _ = pr_branch
    result, out = run_smoke(pytester, "--simplefsdp-base=gate-demo-base", f"--simplefsdp-torchtitan-repo={CHECKOUT}",
                            "--simplefsdp-confirm=1", "-rA", timeout=2400)
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    cells = cells_of(out)
    assert cells["llama3-dp2-eager"].get("gate") is None
    new, trunk = cells["llama3-dp2-aot_fx_trace-mp_default"], cells["deepseek_v3-dp2-ep2-eager"]
    assert new["gate"] == "new" and new["base"]["passed"] == new["base"]["runs"] == 1
    assert "planted: aot_fx_trace refused for llama3" in new["error_line"]
    assert trunk["gate"] == "broken trunk" and trunk["base"]["signatures"] == [trunk["signature"]]
    assert "planted: expert parallelism refused" in trunk["signature"]
    doc = json.loads(out.read_text())
    assert doc["gate"]["counts"] == {"new": 1, "broken trunk": 1, "flaky": 0, "known": 0}
    result.stdout.fnmatch_lines([f"*simplefsdp PR gate against base gate-demo-base ({base}): 1 new, 1 broken trunk*"])
