"""--simplefsdp-jobs: cells run at once within the budget; GPUs are handed out disjointly."""

import itertools
import json
import os

import pytest

from helpers import fake_matrix, marked, module_matrix, run_doc


def intervals(run_json):
    """cell id -> (start, end, devices) from the fake ranks' time stamps."""
    out = {}
    for cell in run_doc(run_json)["cells"]:
        dump = os.path.join(cell["log_dir"], "dump")
        stamps = [open(os.path.join(dump, f)).read().split() for f in os.listdir(dump) if f.startswith("times.")]
        if not stamps:  # a cell that failed before its end
            continue
        out[cell["id"]] = (
            min(float(s[0]) for s in stamps),
            max(float(s[1]) for s in stamps),
            {d for s in stamps if len(s) > 2 for d in s[2].split(",")},
        )
    return out


def overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("launcher", ["local", "fork"])
def test_cells_run_at_once_within_the_ranks_budget(run_matrix, pytester, launcher):
    """Under fork, cells that run at once each get a server of their own (a server runs one cell at a time)."""
    out = pytester.path / "run.json"
    text = module_matrix(modes=["pass", "perturb", "nan", "fail"], args=', "--startup", "1.5"')
    result = run_matrix(
        text, "--simplefsdp-jobs=auto", "--simplefsdp-max-ranks=4", f"--simplefsdp-json={out}", launcher=launcher
    )
    result.assert_outcomes(passed=2, failed=2)  # verdicts as without packing
    cells = run_doc(out)["cells"]
    assert {c["launcher"] for c in cells} == {launcher} and not marked("forkserver:")
    result.stdout.fnmatch_lines(["*nan-r2: [[]numerics[]] loss is nan at step 2*", "*fail-r2: [[]runtime[]]*"])
    spans = intervals(out)
    assert overlap(spans["pass-r2"], spans["perturb-r2"])  # 2 + 2 ranks fit the budget of 4
    for a, b, c in itertools.combinations(spans.values(), 3):  # never three 2-rank cells at once
        assert not (overlap(a, b) and overlap(b, c) and overlap(a, c))


def test_gpu_cells_get_disjoint_devices(run_matrix, pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    out = pytester.path / "run.json"
    text = fake_matrix(modes=["pass", "perturb", "exit3"], ranks=[1, 2], args=', "--startup", "1.5"').replace(
        "device: cpu", "device: cuda"
    )
    result = run_matrix(text, "--simplefsdp-jobs=auto", f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=5, failed=1)  # exit3 misbehaves on rank 1: the 1-rank cell passes
    spans = intervals(out)
    for (ida, a), (idb, b) in itertools.combinations(spans.items(), 2):
        if overlap(a, b):
            assert not (a[2] & b[2]), (ida, idb, a[2], b[2])
    assert any(overlap(a, b) for a, b in itertools.combinations(spans.values(), 2))
    assert all(len(s[2]) == int(cid[-1]) for cid, s in spans.items() if not cid.startswith("exit3"))


def test_bad_jobs_value(run_matrix):
    result = run_matrix(fake_matrix(), "--simplefsdp-jobs=many")
    result.stderr.fnmatch_lines(["*--simplefsdp-jobs: expected a positive number or auto, got 'many'*"])


def test_the_plan_packs_as_the_packer_does_in_item_order():
    """schedule.plan simulates the Packer: in item order, a cell waits at the head of the line for its GPUs."""
    from pytest_simplefsdp.run.schedule import plan

    gpus = [str(i) for i in range(8)]
    rows = plan([("a", 4, 10), ("b", 4, 10), ("c", 8, 5), ("d", 2, 1), ("e", 16, 1), ("f", 2, 3)], 99, 8, gpus)
    assert [(k, s, e, d) for k, _, s, e, d in rows] == [
        ("a", 0, 10, gpus[:4]),
        ("b", 0, 10, gpus[4:]),
        ("c", 10, 15, gpus),
        ("d", 15, 16, gpus[:2]),
        ("e", None, None, None),
        ("f", 15, 18, gpus[2:4]),
    ]
    cpu = plan([("a", 2, 10), ("b", 2, 10), ("c", 4, 1), ("d", 9, 2)], 99, 4)  # a budget of 4 ranks
    assert [(k, s, e) for k, _, s, e, _ in cpu] == [("a", 0, 10), ("b", 0, 10), ("c", 10, 11), ("d", 11, 13)]


def test_plan_prints_the_schedule_from_a_stored_runs_times(run_matrix, pytester):
    run_matrix(fake_matrix(modes=["pass", "fail"], args=', "--startup", "1"'))  # stores each cell's wall time
    result = run_matrix(
        fake_matrix(modes=["pass", "fail"], args=', "--startup", "1"'), "--simplefsdp-plan", "--simplefsdp-max-ranks=4"
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp plan: 2 cpu cells on a budget of 4 CPU ranks*",
            "      0s ->       *s  2 ranks          fake::pass-r2",
            "      0s ->       *s  2 ranks          fake::fail-r2",
            "expected: *s packed (--simplefsdp-jobs=auto), *s one cell at a time*",
            f"times: 2 of 2 cells from stored runs (newest: {pytester.path / 'runs'}); *",
        ]
    )
    records = [json.loads(line) for line in (pytester.path / "runs" / "results.jsonl").read_text().splitlines()]
    assert sum(r.get("type") == "cell" for r in records) == 2  # the first run's: the plan launched nothing


@pytest.mark.parametrize("launcher, seconds", [("fork", 24), ("torchrun", 24), ("local", 24)])
def test_plan_without_stored_runs_uses_the_launchers_measured_estimate(run_matrix, launcher, seconds):
    """No stored run: a 2-rank CPU cell counts the profile benchmark's 2-rank median for the launcher that
    will run it. A command target's program cannot be forked: asked for fork, it runs (and is planned) under
    local, as the header says."""
    result = run_matrix(
        fake_matrix(modes=["pass", "fail"]), "--simplefsdp-plan", "--simplefsdp-max-ranks=2", launcher=launcher
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            f"      0s ->      {seconds}s  2 ranks          fake::pass-r2",
            f"     {seconds}s ->      {2 * seconds}s  2 ranks          fake::fail-r2",
            "times: 0 of 2 cells from stored runs*",
        ]
    )


def test_the_plan_takes_stored_times_only_from_cells_the_same_launcher_ran(run_matrix, pytester):
    """A stored run under one launcher is no forecast for another: the torchrun plan counts its own estimate.
    Asked for fork, a command target runs under local, so local's stored times are its forecast."""
    run_matrix(fake_matrix(modes=["pass", "fail"]), launcher="local")  # stores each cell's wall time under local
    result = run_matrix(
        fake_matrix(modes=["pass", "fail"]), "--simplefsdp-plan", "--simplefsdp-max-ranks=2", launcher="torchrun"
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["      0s ->      24s  2 ranks          fake::pass-r2", "times: 0 of 2 cells from stored runs*"]
    )
    for launcher in ("local", "fork"):
        again = run_matrix(
            fake_matrix(modes=["pass", "fail"]), "--simplefsdp-plan", "--simplefsdp-max-ranks=2", launcher=launcher
        )
        again.stdout.fnmatch_lines([f"times: 2 of 2 cells from stored runs (newest: {pytester.path / 'runs'}); *"])
