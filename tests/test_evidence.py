"""Evidence that a cell's label took effect, read from what the run left behind (here: compile traces)."""

import json

from pytest_simplefsdp.judge.evidence import inductor_codegen
from pytest_simplefsdp.shim.effects import policy_of

from helpers import cells_of


def trace_line(kind, payload=True):
    head = f"V1201 07:46:23.328000 3627 torch/_inductor/graph.py:3138] {json.dumps({kind: {'filename': 'x.py'}, 'rank': 0})}"
    return head + ("\n\tdef call(args):\n\t    pass\n" if payload else "\n")


def write_trace(folder, ranks):
    """ranks: per rank, the record kinds its TORCH_TRACE file holds."""
    folder.mkdir()
    for rank, kinds in enumerate(ranks):
        (folder / f"dedicated_log_torch_trace_rank_{rank}_x.log").write_text("".join(trace_line(k) for k in kinds))
    return folder


def test_inductor_output_code_on_every_rank_is_evidence(tmp_path):
    trace = write_trace(tmp_path / "torch_trace", [["artifact", "inductor_output_code"], ["inductor_output_code"] * 2])
    ev = inductor_codegen(trace)
    assert ev.ok and ev.seen == "3 inductor output-code records in 2 trace files"


def test_a_traced_graph_without_inductor_code_contradicts_the_label(tmp_path):
    """What aot_fx_trace with the default (regional) strategy leaves on CPU: graphs, no inductor code."""
    trace = write_trace(tmp_path / "torch_trace", [["artifact", "chromium_event"], ["artifact"]])
    ev = inductor_codegen(trace)
    assert not ev.ok
    assert ev.line().startswith(
        "backend=inductor: expected inductor output code in the compile trace of every "
        "rank, saw none in 2 of 2 trace files"
    )


def test_one_rank_without_inductor_code_is_enough_to_fail(tmp_path):
    trace = write_trace(tmp_path / "torch_trace", [["inductor_output_code"], ["artifact"]])
    ev = inductor_codegen(trace)
    assert not ev.ok and "none in 1 of 2 trace files (dedicated_log_torch_trace_rank_1_x.log); 1 elsewhere" in ev.seen


def test_no_trace_at_all_is_no_evidence(tmp_path):
    ev = inductor_codegen(tmp_path / "missing")
    assert not ev.ok and ev.seen.startswith("no compile trace at ")
    (tmp_path / "empty").mkdir()
    assert inductor_codegen(tmp_path / "empty").seen.startswith("no trace files in ")


def test_a_payload_line_that_mentions_the_kind_is_not_a_record(tmp_path):
    trace = tmp_path / "torch_trace"
    trace.mkdir()
    (trace / "rank_0.log").write_text(trace_line("artifact") + '\t] {"inductor_output_code": 1}\n')
    assert not inductor_codegen(trace).ok


def test_a_command_target_that_ignores_its_tp_flag_fails_as_invalid_config(run_matrix, pytester):
    """The label says tp=2; the program trains, exits 0, and records a TP mesh of 1: not a pass."""
    from helpers import fake_matrix

    text = (
        fake_matrix(modes=["pass", "ignoretp"], args=', "--tp", "{tp}"')
        .replace("  ranks: [2]\n", "  ranks: [2]\n  tp: [2]\n", 1)
        .replace("target:\n", "target:\n  evidence: {tp: mesh.tp}\n", 1)
    )
    out = pytester.path / "run.json"
    result = run_matrix(text, f"--simplefsdp-json={out}")
    result.assert_outcomes(passed=1, failed=1)
    cells = cells_of(out)
    honest, liar = cells["pass-r2-2"], cells["ignoretp-r2-2"]
    assert honest["evidence"] == [
        {"axis": "tp=2", "expected": "mesh.tp = 2 on every rank", "seen": "2 on ranks 0, 1", "ok": True}
    ]
    assert liar["failure_class"] == "invalid_config"
    assert liar["error_line"] == (
        "the run does not show its label: tp=2: expected mesh.tp = 2 on every rank, saw 1 on ranks 0, 1"
    )
    assert sorted(liar["losses"]) == ["1", "2", "3"]  # it trained: only the evidence tells
    # the footnotes sum the evidence up and show the cell that failed it; -v lists every cell
    result.stdout.fnmatch_lines(
        [
            "evidence: 2 cells checked against their labels (1 of 2 checks hold)",
            "    (-v lists them per cell)",
            "evidence (the run shows its label: checks that hold / checks, labels checked):",
            "    ignoretp-r2-2: 0/1 (tp=2)",
        ]
    )
    assert "pass-r2-2: 1/1" not in result.stdout.str()
    verbose = run_matrix(text, "-v")
    verbose.stdout.fnmatch_lines(
        ["evidence (the run shows its label*", "    pass-r2-2: 1/1 (tp=2)", "    ignoretp-r2-2: 0/1 (tp=2)"]
    )


def test_the_dry_run_says_what_will_be_checked(run_matrix):
    from helpers import fake_matrix

    text = (
        fake_matrix(args=', "--tp", "{tp}"')
        .replace("  ranks: [2]\n", "  ranks: [2]\n  tp: [2]\n", 1)
        .replace("target:\n", "target:\n  evidence: {tp: mesh.tp}\n", 1)
    )
    result = run_matrix(text, "--simplefsdp-dry-run", "-v")
    result.stdout.fnmatch_lines(["*pass-r2-2*", "*", "  evidence: tp=2 <- mesh.tp"])


def test_bad_evidence_keys_are_usage_errors_naming_the_file(run_matrix, pytester):
    from helpers import fake_matrix

    text = fake_matrix().replace("target:\n", "target:\n  evidence: {nope: mesh.tp}\n", 1)
    result = run_matrix(text)
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        [
            "*fake.yaml:2: target.evidence must map axes (mode, ranks) to probe keys "
            "'<section>.<name>', got {'nope': 'mesh.tp'}*"
        ]
    )


def test_a_memory_policy_is_read_from_the_tags_it_wrote():
    """The tag counts the probe read off real traced graphs (llama3 dp2, full and default), and the others'."""
    assert policy_of({"MUST_RECOMPUTE": 616, "MUST_SAVE": 24, "mm_recomputed": 30}) == "full"
    assert policy_of({"PREFER_RECOMPUTE": 234, "MUST_SAVE": 26, "mm_saved": 15}) == "default"
    assert policy_of({"PREFER_RECOMPUTE": 234, "MUST_SAVE": 20, "mm_saved": 8, "mm_recomputed": 7}) == "eager"
    assert policy_of({"PREFER_RECOMPUTE": 9, "MUST_SAVE": 3, "MUST_CPU_OFFLOAD": 2}) == "sac_and_offload"
    assert policy_of({}) == "none"
