"""The mutation tier on fake targets: each verdict (killed by which check, survived, inconclusive) and its
report; the per-parameter comparison that kills gradient mutants, on hand-made probe records."""

import json
from types import SimpleNamespace

import pytest

from pytest_simplefsdp.judge.mutants import killed_by
from pytest_simplefsdp.judge.numerics import compare_params, param_line, read_param_stats
from pytest_simplefsdp.spec.matrix import Lane

from helpers import fake_matrix, run_doc

MUTANT_TARGET = """\
numerics:
  global_batch_size: 8
  baseline: {}
  lanes:
    - name: exact
"""


def mutant_matrix(names):
    text = fake_matrix(modes=["pass"], extra=MUTANT_TARGET)
    return text.replace("target:\n", f"target:\n  mutants: {json.dumps(names)}\n")


def test_each_mutant_verdict_and_the_check_that_killed_it(run_matrix, pytester):
    out, md = pytester.path / "run.json", pytester.path / "status.md"
    result = run_matrix(
        mutant_matrix(["loss_shift", "crash", "noop", "idle"]),
        "--simplefsdp-mutants=all",
        "-v",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-status-md={md}",
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*fake.yaml::pass-r2[[]mutant-loss_shift[]] PASSED*",
            "*fake.yaml::pass-r2[[]mutant-noop[]] FAILED*",
            "*pass-r2[[]mutant-noop[]]: mutant noop survived: the run with this bug was green (declared by fake.yaml)*",
            "*pass-r2[[]mutant-idle[]]: mutant idle did not act in this run*",
            "*profile fake, target command, launcher local): mutation tier: 2 of 4 mutant runs killed*",
        ]
    )
    run = run_doc(out)
    assert run["cells"] == []  # the tier runs mutants, not the plain cells
    got = {m["mutant"]: (m["mutation"], m["killed_by"]) for m in run["mutants"]}
    assert got == {
        "loss_shift": ("killed", "loss"),
        "crash": ("killed", "exit (runtime)"),
        "noop": ("survived", None),
        "idle": ("inconclusive", None),
    }
    # the unmutated cell ran once, as the baseline all four were compared with
    assert [b["id"] for b in run["baselines"]] == ["baseline-pass-r2"] and run["baselines"][0]["mutant"] is None
    logs = {m["mutant"]: m["log_dir"] for m in run["mutants"]}
    assert logs["loss_shift"] != logs["noop"] and "mutant-loss_shift" in logs["loss_shift"]
    assert "## mutation tier — profile fake: mutation tier: 2 of 4 mutant runs killed" in md.read_text()


def test_an_evidence_kill_names_every_label_part_the_run_did_not_show():
    """A layout bug can break two label parts at once (EP left off one layer: its experts neither over ep nor at
    efsdp's data-parallel share); the kill names both, once each, in the evidence's order."""
    evidence = [
        {"axis": "compile=eager", "ok": True},
        {"axis": "dp_shard=2", "ok": False},
        {"axis": "ep=2", "ok": False},
        {"axis": "ep=2", "ok": False},
        {"axis": "memory", "ok": True},
    ]
    result = SimpleNamespace(failure_class="invalid_config", invariants=None, numerics=None, evidence=evidence)
    assert killed_by(result) == "evidence (dp_shard=2, ep=2)"
    assert killed_by(SimpleNamespace(**(vars(result) | {"evidence": []}))) == "evidence"


def test_without_the_option_no_mutant_runs(run_matrix, pytester):
    out = pytester.path / "run.json"
    result = run_matrix(mutant_matrix(["loss_shift"]), f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1)
    assert "mutants" not in run_doc(out)


def test_an_unknown_mutant_is_a_usage_error(run_matrix):
    result = run_matrix(mutant_matrix(["loss_shift"]), "--simplefsdp-mutants=loss_shift,typo")
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        ["*--simplefsdp-mutants: fake.yaml (target command): unknown mutant 'typo'; known: loss_shift, or all*"]
    )


def test_mutant_names_in_a_matrix_file_are_checked(run_matrix):
    result = run_matrix(mutant_matrix(["not a name"]))
    result.stderr.fnmatch_lines(["*fake.yaml:2: target.mutants must be a list of names, got [[]'not a name'[]]*"])


def records(tmp_path, rank, lines):
    folder = tmp_path / "evidence"
    folder.mkdir(exist_ok=True)
    (folder / f"grads.rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def stats(tmp_path, name, grad_w1, checksum=7):
    """Two ranks of one cell: each holds one expert parameter; a half-written last line as a killed rank leaves."""
    base = tmp_path / name
    base.mkdir()
    records(
        base,
        0,
        [
            {"kind": "init_checksum", "step": 0, "values": {"experts.w1": checksum, "norm.weight": 3.0}},
            {"kind": "grad_norm", "step": 1, "values": {"experts.w1": grad_w1, "norm.weight": 0.25}},
        ],
    )
    folder = records(base, 1, [{"kind": "grad_norm", "step": 1, "values": {"experts.w2": 0.5, "norm.weight": 0.25}}])
    with open(folder / "grads.rank1.jsonl", "a") as f:
        f.write('{"kind": "param_norm", "st')
    return read_param_stats(folder)


def test_a_halved_expert_gradient_is_named_with_its_ratio(tmp_path):
    lane = Lane("close", [{}], rtol=2e-4, atol=1e-5)
    base, cell = stats(tmp_path, "base", 0.0082), stats(tmp_path, "cell", 0.0041)
    assert base["grad_norm"][1] == {"experts.w1": 0.0082, "norm.weight": 0.25, "experts.w2": 0.5}
    ok, rep = compare_params(cell, base, lane)
    assert not ok and rep["first_difference"] == {
        "kind": "grad_norm",
        "step": 1,
        "param": "experts.w1",
        "cell": 0.0041,
        "baseline": 0.0082,
        "rtol": 2e-4,
        "atol": 1e-5,
        # the lane's floor scaled by w1's gradient against the largest of the step (w2's 0.5): 1.64e-7
        "floor": pytest.approx(1e-5 * 0.0082 / 0.5),
        "margin": pytest.approx(0.0041 / (1e-5 * 0.0082 / 0.5 + 2e-4 * 0.0082)),
    }
    assert param_line(rep, "baseline-x") == (
        "experts.w1: grad norm 0.0041 vs 0.0082 of baseline baseline-x at step 1, ratio 0.5 (rtol 0.0002, atol "
        "1.64e-07 (the lane's 1e-05 scaled to this value); 2.27e+03x its tolerance)"
    )
    assert compare_params(base, base, lane)[0]


def test_weights_must_load_bit_for_bit_whatever_the_lane(tmp_path):
    lane = Lane("loose", [{}], rtol=0.5, atol=1.0)
    ok, rep = compare_params(stats(tmp_path, "cell", 0.0082, checksum=8), stats(tmp_path, "base", 0.0082), lane)
    assert not ok and rep["first_difference"]["kind"] == "init_checksum" and rep["weights_differing"] == 1
    # a hash: both values whole, no ratio, and no relative difference recorded
    assert (
        param_line(rep, "b")
        == "experts.w1: weight checksum 8 vs 7 of baseline b at step 0 (exact: the loaded weights differ)"
        and "init_checksum" not in rep["max_rel_diff"]
    )


def test_a_gradient_on_one_side_only_differs(tmp_path):
    lane = Lane("close", [{}], rtol=1.0, atol=1.0)
    base = stats(tmp_path, "base", 0.0082)
    cell = json.loads(json.dumps(base), object_hook=lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()})
    cell["grad_norm"][1]["norm.weight"] = None
    ok, rep = compare_params(cell, base, lane)
    assert not ok and rep["first_difference"]["param"] == "norm.weight"
    assert "grad norm none vs 0.25" in param_line(rep, "b")
    cell["grad_norm"][1]["norm.weight"] = 0.25
    cell["grad_norm"][1]["extra.bias"] = 1.0  # a parameter the baseline does not have
    assert compare_params(cell, base, lane)[1]["first_difference"]["param"] == "extra.bias"


@pytest.mark.parametrize("value", ["all", "expert_grad_divide,dropped_grad"])
def test_titan03_mutants_parse(value):
    from pytest_simplefsdp.judge.mutants import TITAN03, parse_names

    names = [m.name for m in parse_names(value, TITAN03)]
    assert names == ([m.name for m in TITAN03] if value == "all" else ["expert_grad_divide", "dropped_grad"])


def test_later_steps_are_measured_and_judged_only_up_to_grad_steps(tmp_path):
    base = stats(tmp_path, "base", 0.0082)
    cell = json.loads(json.dumps(base), object_hook=lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()})
    base["grad_norm"][2] = {"experts.w1": 0.01}
    cell["grad_norm"][2] = {"experts.w1": 0.0103}  # 3 % off at step 2, as a router gate drifts
    ok, rep = compare_params(cell, base, Lane("close", [{}], rtol=2e-4, atol=1e-5))  # grad_steps 1
    assert ok and rep["max_rel_diff"]["grad_norm"] == {"1": 0.0, "2": pytest.approx(0.03)}
    ok, rep = compare_params(cell, base, Lane("close", [{}], rtol=2e-4, atol=1e-5, grad_steps=2))
    assert not ok and (rep["first_difference"]["step"], rep["first_difference"]["param"]) == (2, "experts.w1")
