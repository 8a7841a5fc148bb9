"""End to end on the real system under test: torchtitan 0.3 graph_trainer cells on CPU ranks.

These start real `torchrun -m torchtitan.train` jobs (20-60 s each on 2 cores).
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_simplefsdp.paths import MATRIX_DIR
from pytest_simplefsdp.spec.matrix import load_matrix

from helpers import cells_of, marked, run_doc

titan = pytest.importorskip("torchtitan", reason="torchtitan is the system under test: pip install torchtitan==0.3.0")
if not __import__("importlib.metadata").metadata.version("torchtitan").startswith("0.3."):
    pytest.skip("these cells are torchtitan 0.3's (tox -e titan03)", allow_module_level=True)

pytestmark = pytest.mark.real  # (the long comparisons and the benchmarks are e2e as well: tox -e e2e)


def test_smoke_tier_runs_real_cells(pytester):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-m",
        "smoke",
        "-v",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=1500,
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["*cpu.yaml::llama3-dp2-eager PASSED*", "*simplefsdp composability*", "llama3 dp2 * pass *s * pass *s*"]
    )
    cells = cells_of(out)
    assert set(cells) == {"llama3-dp2-eager", "llama3-dp2-aot_fx_trace-mp_default", "deepseek_v3-dp2-ep2-eager"}
    for cell in cells.values():
        assert sorted(cell["losses"]) == ["1", "2", "3"]
        assert all(math.isfinite(v) and 4 < v < 12 for v in cell["losses"].values())
        assert cell["losses"]["3"] < cell["losses"]["1"]  # it trains
        command = (Path(cell["log_dir"]) / "command.txt").read_text()  # the default on CPU: the fork launcher
        assert cell["launcher"] == "fork" and "RANK=1 " in command and "-m torchtitan.train" in command
        assert "[simplefsdp-shim] applied: device_type_cpu" in "".join(  # the server's shim, said in each rank's log
            Path(p).read_text() for p in cell["rank_logs"]["1"]
        )
    # numerics: same seed checkpoint and global batch; tracing must not change a bit (lane exact)
    assert cells["llama3-dp2-eager"]["losses"] == cells["llama3-dp2-aot_fx_trace-mp_default"]["losses"]
    traced = cells["llama3-dp2-aot_fx_trace-mp_default"]["numerics"]
    assert (traced["lane"], traced["baseline"], traced["max_abs_diff"]) == ("exact", "llama3-dp2-eager", 0)
    ep = cells["deepseek_v3-dp2-ep2-eager"]["numerics"]
    # judged by its own layout's measured noise (matrix/noise/cpu.yaml: 5x its gradient noise, not 2e-3) on the
    # machine the file names; elsewhere by its lane, and the record says why
    assert ep["baseline"] == "baseline-deepseek_v3-dp2-eager"
    noise = load_matrix(MATRIX_DIR / "cpu.yaml").numerics.noise.layouts["deepseek_v3-dp2-ep2-eager"]["grad_norm"]
    if "noise" in ep:
        assert ep["lane"] == "close" and ep["noise"].startswith("not applied: "), ep["noise"]
    else:
        assert ep["lane"] == "close, layout noise x5" and ep["params"]["rtol"] == pytest.approx(5 * noise)
    assert ep["max_rel_diff"] <= 1e-4
    # per parameter (the shim's grad probe): weights loaded alike, gradient and parameter norms within the lane
    for rep in (traced["params"], ep["params"]):
        assert rep["first_difference"] is None and rep["checked"] > 100, rep
    assert set(traced["params"]["max_rel_diff"]["grad_norm"].values()) == {0.0}  # lane exact: bit for bit, 3 steps
    assert ep["params"]["weights_differing"] == 0 and "init_checksum" not in ep["params"]["max_rel_diff"]
    assert not marked("llama3-dp2")


def test_failing_compile_cell_is_xfailed_with_its_trace_rendered(pytester):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-rx",
        "-k",
        "deepseek_v3-tp2-ep2-pp2-Interleaved1F1B-aot_fx_trace",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=900,
    )
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(
        ["*known failure graphpp-tp-backward-only-inputs (https://github.com/pytorch/torchtitan/issues/3780)*"]
    )
    cell = run_doc(out)["cells"][0]
    assert cell["known_failure"] == "graphpp-tp-backward-only-inputs" and cell["failure_class"] == "compile"
    assert cell["error_line"].startswith("ValueError: Forward graph outputs require backward-only inputs")
    assert Path(cell["log_dir"], "torch_trace").is_dir()
    if shutil.which("tlparse") or Path(sys.executable).with_name("tlparse").exists():
        assert cell["trace_html"] and Path(cell["trace_html"]).name == "index.html"
        assert Path(cell["trace_html"]).is_file()


def test_killed_rank_is_a_crash_of_that_rank_with_no_survivors(pytester):
    """kill -9 one rank of a real cell mid-training: reported as its crash, its peers torn down at once."""
    matrix = pytester.path / "long.yaml"
    matrix.write_text((MATRIX_DIR / "cpu.yaml").read_text().replace("steps: 3", "steps: 2000"))
    shutil.copytree(MATRIX_DIR / "noise", pytester.path / "noise")
    runs = pytester.path / "runs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={matrix}",
            "-k",
            "llama3-dp2-eager and not fsdp2 and not spmd_types",
            f"--simplefsdp-artifacts={runs}",
            "-p",
            "no:cacheprovider",
            "--simplefsdp-confirm=1",  # (a confirming run would train its 2000 steps again)
            "--simplefsdp-launcher=torchrun",
        ],  # (it finds the victim by torchrun's log folders)
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        victim, deadline = None, time.monotonic() + 300
        while victim is None and time.monotonic() < deadline:
            logs = list(runs.glob("cpu/llama3-dp2-eager/torchrun/*/attempt_0/1/std*.log"))
            if any("step:  5" in p.read_text(errors="replace") for p in logs):
                victim = next(
                    (
                        p
                        for p in marked("llama3-dp2-eager")
                        if p.environ().get("RANK") == "1"  # the rank,
                        and p.ppid() != os.getpid()
                        and "torchtitan.train" in " ".join(p.cmdline())  # not
                        and "reaper.py" not in " ".join(p.cmdline())
                    ),
                    None,
                )  # the reaper above it
            time.sleep(0.2)
        assert victim is not None, "rank 1 never reached step 5"
        victim.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "llama3-dp2-eager: [crash] rank 1 killed by SIGKILL" in out, out[-3000:]
    # peers are torn down at once, not left to a collective timeout or the cell's: no hang, nobody still running
    assert "[hang]" not in out and "timed out" not in out and "still running" not in out, out[-3000:]
    assert not marked("llama3-dp2-eager")


def run_under(pytester, launchers, selection, *args, cells=2, docs=None):
    """The same passing real cells under each launcher: launcher -> {cell id: cell record} (``docs``: launcher ->
    the run's JSON document)."""
    runs, selection = {}, f"({selection}) and not fsdp2 and not spmd_types"  # ids are substrings of their twins'
    for launcher in launchers:
        out = pytester.path / f"{launcher}.json"
        result = pytester.runpytest_subprocess(
            "--simplefsdp-matrix",
            "--simplefsdp-profile=cpu",
            "-k",
            selection,
            f"--simplefsdp-launcher={launcher}",
            f"--simplefsdp-json={out}",
            f"--simplefsdp-artifacts={pytester.path / launcher}",
            *args,
            timeout=900,
        )
        result.assert_outcomes(passed=cells)
        doc = run_doc(out)
        runs[launcher] = {c["id"]: c for c in doc["cells"]}
        if docs is not None:
            docs[launcher] = doc
    return runs


def losses_of(cells):
    return {cell_id: c["losses"] for cell_id, c in cells.items()}


@pytest.mark.e2e
def test_the_default_cpu_launcher_matches_torchrun_on_real_cells_of_both_models(pytester):
    """The default (auto: fork on CPU) against the reference launcher, on an eager cell of each model and a traced
    one: the same verdicts, bitwise the same losses, gradient norms and comparison with the baseline; each record
    names its launcher. The second run starts from the seed checkpoints and baseline the first one kept."""
    docs = {}
    runs = run_under(
        pytester,
        ("torchrun", "auto"),
        "llama3-dp2-eager or deepseek_v3-dp2-ep2-eager or llama3-dp2-aot_fx_trace-mp_default",
        cells=3,
        docs=docs,
    )
    assert len(runs["torchrun"]) == 3
    for cell_id, ref in runs["torchrun"].items():
        got = runs["auto"][cell_id]
        assert (got["status"], got["failure_class"], got["failing_rank"]) == ("passed", None, None)
        assert got["losses"] == ref["losses"] and len(got["losses"]) == 3, cell_id
        assert got["grad_norms"] == ref["grad_norms"], cell_id
        assert got["numerics"] == ref["numerics"], cell_id
        assert (ref["launcher"], got["launcher"]) == ("torchrun", "fork")
    assert docs["auto"]["meta"]["launcher"] == "fork"
    assert [s["kept_from_earlier_run"] for s in docs["torchrun"]["seeds"]] == [False, False]
    assert [s["kept_from_earlier_run"] for s in docs["auto"]["seeds"]] == [True, True]
    assert [b["reused_from"] is not None for b in docs["auto"]["baselines"]] == [True]  # deepseek_v3-dp2-eager's
    assert not marked("llama3-") and not marked("deepseek_v3-") and not marked("forkserver:")


def test_a_real_cell_runs_as_a_slurm_step(pytester, slurm):
    """The SLURM launcher's end-to-end path in CI: one real 2-rank cell as a job step of the local SLURM (the
    comparison with torchrun, and a cell across two nodes, are the e2e test below)."""
    cell = run_under(pytester, ("slurm",), "llama3-dp2-eager", cells=1)["slurm"]["llama3-dp2-eager"]
    assert cell["launcher"] == "slurm" and sorted(cell["losses"]) == ["1", "2", "3"]
    assert cell["losses"]["3"] < cell["losses"]["1"]
    assert any(d.startswith("SLURM step ") for d in cell["details"]), cell["details"]


@pytest.mark.e2e
def test_slurm_launcher_matches_torchrun_on_real_cells(pytester, slurm):
    """Through the real single-node SLURM: a 2-rank cell on one node and a 4-rank cell on two nodes
    (torchrun's multi-node rendezvous), same verdicts and bitwise the same losses as the reference."""
    runs = run_under(
        pytester,
        ("torchrun", "slurm"),
        "llama3-dp2-eager or llama3-dp2-tp2-eager",
        "--simplefsdp-slurm-ranks-per-node=2",
    )
    assert losses_of(runs["slurm"]) == losses_of(runs["torchrun"])
    tp = runs["slurm"]["llama3-dp2-tp2-eager"]
    assert len(tp["losses"]) == 3 and "/torchrun/node1/" in tp["rank_logs"]["3"][0]
    assert any(d.startswith("SLURM step ") and " on n[1-2] " in d for d in tp["details"]), tp["details"]


def run_one_failing_cell(pytester, matrix):
    """Run a one-cell matrix file that must fail; its JSON record."""
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        f"--simplefsdp-matrix-file={matrix}",
        "--simplefsdp-confirm=1",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=900,
    )
    result.assert_outcomes(failed=1)
    return run_doc(out)["cells"][0]


@pytest.mark.e2e
def test_an_inductor_label_without_inductor_code_fails_as_invalid_config(pytester):
    """The bug that once made 36 GPU cells duplicates: a cell called inductor that inductor never compiled.
    Here the flag the target passes is overridden after it (extra_args), as an ignored flag would be; the
    run trains and exits 0, and the evidence check fails it."""
    matrix = pytester.path / "lying.yaml"
    matrix.write_text(
        textwrap.dedent("""\
        profile: lying
        target: titan03
        device: cpu
        world_sizes: [2]
        degrees: [dp_shard]
        timeout: 600
        settings:
          steps: 2
          extra_args: ["--compile.inductor_compilation", "regional"]   # undoes the target's `full`
        models:
          llama3: {module: titan03_configs, config: llama3_debugmodel_cpu}
        axes:
          model: [llama3]
          dp_shard: [2]
          compile: [aot_fx_trace]
          backend: [inductor]
          memory_policy: [default]
        """)
    )
    cell = run_one_failing_cell(pytester, matrix)
    assert sorted(cell["losses"]) == ["1", "2"]  # it trained: only the evidence tells
    assert cell["failure_class"] == "invalid_config"
    # two independent witnesses: the terminal graph pass that ran (the probe) and the compile trace
    assert cell["error_line"] == (
        "the run does not show its label: backend=inductor: expected "
        "effects.inductor_compilation = full on every rank, saw regional on ranks 0, 1"
    )
    codegen = [e for e in cell["evidence"] if e["expected"].startswith("inductor output code")]
    assert len(codegen) == 1 and not codegen[0]["ok"] and codegen[0]["seen"].startswith("none in 2 of 2 trace files")
    assert "--compile.inductor_compilation full" in Path(cell["log_dir"], "command.txt").read_text()


def test_a_tp_label_that_torchtitan_did_not_build_fails_as_invalid_config(pytester):
    """tp=2 asked, undone after the target's flags (an ignored flag would look the same): the run trains
    as plain FSDP on 2 ranks and exits 0; the parameters lie sharded over fsdp 2, over no tp dimension."""
    matrix = pytester.path / "lying_tp.yaml"
    matrix.write_text(
        textwrap.dedent("""\
        profile: lying-tp
        target: titan03
        device: cpu
        world_sizes: [2]
        degrees: [dp_shard, tp]
        timeout: 600
        settings:
          steps: 2
          extra_args: ["--parallelism.tensor_parallel_degree", "1", "--parallelism.data_parallel_shard_degree", "2"]
        models:
          llama3: {module: titan03_configs, config: llama3_debugmodel_cpu}
        axes:
          model: [llama3]
          dp_shard: [1]
          tp: [2]
          compile: [eager]
        """)
    )
    cell = run_one_failing_cell(pytester, matrix)
    assert sorted(cell["losses"]) == ["1", "2"]  # it trained
    assert cell["failure_class"] == "invalid_config"
    # every parameter read: split over 2 fsdp ranks, where the label says 1, and over no tp rank, where it says 2
    assert cell["error_line"].startswith(
        "the run does not show its label: dp_shard=1: expected every parameter split "
        "over 1 rank of fsdp/dp_shard/dp_shard_cp/efsdp/dp_shard_mod_ep, saw 0 of 45 parameters, "
        "0.0% of bytes on rank 0: "
    )
    wrong = {e["axis"]: e["seen"] for e in cell["evidence"] if not e["ok"]}
    assert set(wrong) == {"dp_shard=1", "tp=2", "memory"} and wrong["tp=2"].startswith(
        "0 of 32 parameters, 0.0% of bytes"
    )
    # the bytes say the same: fsdp halves the norms too, which tp=2 would keep whole (6656 bytes fewer than the label)
    assert wrong["memory"].startswith("rank 0 holds 12327424 bytes of params, expected 12334080 (+-0)")


def test_a_label_applied_to_part_of_the_model_is_killed_by_its_own_evidence(pytester):
    """Two bugs that leave training as it was: SimpleFSDP replicating the output projection over the fsdp mesh
    (its gradient all-reduced), and the memory policy leaving the first block untagged. The evidence read per
    parameter and per block names each; the bytes each rank holds say the same of the first."""
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-k",
        "llama3-dp2-aot_fx_trace-mp_default and not fsdp2 and not spmd_types",
        "--simplefsdp-mutants=fsdp_partial,memory_policy_partial",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=900,
    )
    result.assert_outcomes(passed=2)
    mutated = {m["mutant"]: m for m in run_doc(out)["mutants"]}
    assert {k: (m["mutation"], m["killed_by"]) for k, m in mutated.items()} == {
        "fsdp_partial": ("killed", "evidence (dp_shard=2, memory)"),
        "memory_policy_partial": ("killed", "evidence (memory_policy=default)"),
    }
    head = mutated["fsdp_partial"]
    assert (
        "saw 44 of 45 parameters" in head["error_line"] and "lm_head.weight over 1 on ranks 0, 1" in head["error_line"]
    )
    held = next(e for e in head["evidence"] if e["axis"] == "memory")
    assert not held["ok"] and held["seen"].startswith("rank 0 holds ")  # the head's 2 MiB held twice
    assert head["memory"]["ratio"] > 1.05
    assert "block 0: none on ranks 0, 1" in mutated["memory_policy_partial"]["error_line"]


def test_each_axis_applied_to_part_of_the_model_is_killed_by_its_own_evidence(pytester):
    """TP, HSDP's replication, EP and PP each applied to all of the model but one piece, with training as it was
    (TP: the first column-wise weight held whole on both TP ranks, its output cut to the TP shard; HSDP: the head
    sharded over the replicate dimension too; EP: one MoE layer's experts left to the dense mesh, as with EP 1)
    or a model one block shorter (PP: the last block on no stage). Each is killed by its own axis's evidence,
    which names the piece."""
    out = pytester.path / "run.json"
    cells = ("llama3-dp2-tp2-eager", "llama3-dpr2-dp2-eager", "deepseek_v3-dp2-ep2-eager", "llama3-dp2-pp2-1F1B-eager")
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-k",
        f"mutation and ({' or '.join(cells)}) and not fsdp2 and not spmd_types",
        "--simplefsdp-mutants=tp_partial,replicate_partial,ep_partial,pp_partial",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=1200,
    )
    result.assert_outcomes(passed=4)
    mutated = {m["mutant"]: m for m in run_doc(out)["mutants"]}
    assert {k: (m["mutation"], m["killed_by"]) for k, m in mutated.items()} == {
        "tp_partial": ("killed", "evidence (tp=2, memory)"),
        "replicate_partial": ("killed", "evidence (dp_replicate=2, memory)"),
        "ep_partial": ("killed", "evidence (dp_shard=2, ep=2)"),  # the experts' data-parallel share is not efsdp's
        "pp_partial": ("killed", "evidence (pp=2)"),
    }
    seen = {k: {e["axis"]: e["seen"] for e in m["evidence"] if not e["ok"]} for k, m in mutated.items()}
    assert "layers.0.attention.qkv_linear.wqkv.weight over 1 on ranks 0, 1, 2, 3" in seen["tp_partial"]["tp=2"]
    assert seen["replicate_partial"]["dp_replicate=2"] == (
        "44 of 45 parameters, 91.5% of bytes on rank 0: lm_head.weight over 1 on ranks 0, 1, 2, 3"
    )
    assert seen["ep_partial"]["ep=2"].startswith(
        "12 of 15 parameters, 80.0% of bytes on rank 0: "
        "layers.5.moe.routed_experts.inner_experts.w1_EFD over 1 on ranks 0, 1"
    )
    assert seen["pp_partial"]["pp=2"].startswith("blocks 5 on none")
    assert all(m["memory"] for m in mutated.values())  # recorded for every layout, read against each one's rules


def test_the_mutation_tier_kills_gradient_load_update_schedule_and_state_bugs(pytester):
    """On one EP cell (the close lane): the bug class of torchtitan issue 1551 (expert gradients divided once more:
    AdamW keeps the losses within 1e-5, the per-parameter gradient norms name it), expert weights moved after the
    checkpoint load (the weight checksum at step 0), an update lost on rank 1 (the issue's case: the changed
    invariant), and the three bugs that act from step 2 on: an update (changed), a schedule (lr) and a state (the
    update norm against the baseline at step 2)."""
    out = pytester.path / "run.json"
    names = (
        "expert_grad_divide,expert_placement,lost_update,update_lost_from_step2,lr_skew_from_step2,"
        "optimizer_state_lost_at_step2"
    )
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-k",
        "deepseek_v3-dp2-ep2-eager and not fsdp2 and not spmd_types",
        f"--simplefsdp-mutants={names}",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=1500,
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*mutation tier: 6 of 6 mutant runs killed*"])
    mutated = {m["mutant"]: m for m in run_doc(out)["mutants"]}
    assert {k: (m["mutation"], m["killed_by"]) for k, m in mutated.items()} == {
        "expert_grad_divide": ("killed", "grad_norm"),
        "expert_placement": ("killed", "init_checksum"),
        "lost_update": ("killed", "invariant (changed)"),
        "update_lost_from_step2": ("killed", "invariant (changed)"),
        "lr_skew_from_step2": ("killed", "invariant (lr)"),
        "optimizer_state_lost_at_step2": ("killed", "update_norm"),
    }
    divide = mutated["expert_grad_divide"]
    first = divide["numerics"]["params"]["first_difference"]
    # half of the EP 2 layout's gradient, whose norm is within 2e-5 of the dp 2 baseline's at step 1
    assert ".routed_experts." in first["param"] and first["step"] == 1
    assert first["cell"] / first["baseline"] == pytest.approx(0.5, rel=1e-4)
    assert ("ratio 0.5" in divide["error_line"]) and divide["error_line"].startswith(first["param"])
    assert mutated["lost_update"]["error_line"].startswith("optimizer-step invariant (changed): rank 1: ")
    assert "did not change in the optimizer step of step 1" in mutated["lost_update"]["error_line"]
    assert "of step 2" in mutated["update_lost_from_step2"]["error_line"]
    state = mutated["optimizer_state_lost_at_step2"]["numerics"]["params"]["first_difference"]
    assert (state["kind"], state["step"]) == ("update_norm", 2)
    log = "".join(Path(p).read_text() for p in divide["rank_logs"]["0"])
    assert "[simplefsdp-shim] mutant: expert_grad_divide" in log


HOOKWRAP = """\
\"\"\"A foreign import hook, as a profiler's: it loads every torchtitan module itself, ahead of the shim's finder,
then runs the module named on its command line as __main__.\"\"\"
import importlib.abc, importlib.util, runpy, sys

class Foreign(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("torchtitan"):
            return None
        for finder in sys.meta_path:
            if finder is self or type(finder).__name__ == "_PostImportFinder":
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                return spec
        return None

sys.meta_path.insert(0, Foreign())
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""

HOOKED = """\
import sys
from pytest_simplefsdp.targets import Titan03


class Hooked(Titan03):
    \"\"\"titan03 whose ranks run under a foreign import hook (hookwrap.py beside this conftest).\"\"\"

    def command(self, cell, dump_folder, **kw):
        command = super().command(cell, dump_folder, **kw)
        command.argv[1:3] = ["-m", "hookwrap", "torchtitan.train"]
        command.env["PYTHONPATH"] = command.env["PYTHONPATH"] + ":" + {folder!r}
        command.env.update({env})
        return command


def pytest_simplefsdp_make_target(matrix, cache_dir):
    if matrix.target == "titan03":
        target = Hooked(matrix, cache_dir)
        target.check()
        return target
"""


@pytest.mark.parametrize("fallback", ["on", "off"])
def test_the_probe_attaches_when_a_foreign_hook_imports_torchtitan(pytester, fallback):
    """Every torchtitan module of the ranks comes in through another finder first on sys.meta_path, ahead of the
    shim's (a profiler's hook): the shim's audit-hook fallback still attaches the probe, and the cell shows its label.
    With the fallback switched off (SIMPLEFSDP_PROBE_FALLBACK=0) the probe cannot see, and the cell says so as infra
    instead of claiming the label is wrong."""
    (pytester.path / "hookwrap.py").write_text(HOOKWRAP)
    env = {} if fallback == "on" else {"SIMPLEFSDP_PROBE_FALLBACK": "0"}
    pytester.makeconftest(HOOKED.format(folder=str(pytester.path), env=env))
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "-k",
        "llama3-dp2-eager and not fsdp2 and not spmd_types",
        "--simplefsdp-launcher=local",
        "--simplefsdp-confirm=1",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=900,
    )
    cell = cells_of(out)["llama3-dp2-eager"]
    hooks = json.loads((Path(cell["log_dir"]) / "evidence" / "rank1.json").read_text())["probe"]["hooks"]
    if fallback == "on":
        result.assert_outcomes(passed=1)
        assert {"config", "mesh", "train_step", "clip"} <= set(hooks) and cell["invariants"]["violation"] is None
    else:
        result.assert_outcomes(failed=1)
        assert cell["failure_class"] == "infra" and "mesh" not in hooks
        assert cell["error_line"].startswith(  # (the first label part the plan checks: cp, from the mesh built)
            "the evidence probe cannot show the label: cp=1: expected mesh.cp = 1 on every rank, saw nothing: the "
            "evidence probe's 'mesh' hook did not attach on ranks 0, 1"
        )
        blind = {e["axis"] for e in cell["evidence"] if e.get("infra")}
        assert {"cp=1", "spmd_backend=partial_dtensor", "trainer=simplefsdp"} <= blind, cell["evidence"]


RESUME = """\
profile: resume
target: titan03
device: cpu
world_sizes: [2]
degrees: [dp_shard, tp]
timeout: 600
settings: {steps: 2, seq_len: 128, local_batch_size: 2, seed: 42}
models:
  llama3: {moe: false, module: titan03_configs, config: llama3_debugmodel_cpu}
features:
  resume:      # save at the end, then a second training loads it (on another layout) and trains to step 4
    flags: ["--checkpoint.enable"]
    then: [["--training.steps 4", "--parallelism.tensor_parallel_degree 2", "--parallelism.data_parallel_shard_degree 1",
            "--checkpoint.exclude_from_loading lr_scheduler,dataloader,optimizer"]]
axes:
  model: [llama3]
  dp_shard: [2]
  tp: [1]
  compile: [eager]
  memory_policy: [none]
  feature: [resume]
ids:
  dp_shard: {prefix: dp}
  tp: {prefix: tp, omit: 1}
  memory_policy: {omit: none}
"""


def test_a_checkpoint_resumes_on_another_layout_in_the_cells_second_run(pytester):
    """A `then` run of a real cell: dp2 trains and saves, the second run loads that checkpoint on tp2."""
    matrix = pytester.path / "resume.yaml"
    matrix.write_text(RESUME)
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        f"--simplefsdp-matrix-file={matrix}",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=900,
    )
    result.assert_outcomes(passed=1)
    cell = run_doc(out)["cells"][0]
    second = next(d for d in cell["details"] if d.startswith("run 2 of 2 loaded the checkpoint"))
    assert second.startswith("run 2 of 2 loaded the checkpoint and trained steps 3-4 ")  # it resumed, not restarted
    assert second.endswith("/run2)") and sorted(cell["losses"]) == ["1", "2"]
    log = "".join(p.read_text() for p in (Path(cell["log_dir"]) / "run2").rglob("*.log"))  # (torchrun's, or rank<N>)
    assert (
        "Finished loading the checkpoint" in log
        and "--parallelism.tensor_parallel_degree 2" in (Path(cell["log_dir"]) / "run2" / "command.txt").read_text()
    )
    assert not marked("llama3-dp2-eager-resume")


@pytest.mark.e2e
def test_the_launcher_benchmark_runs_and_finds_the_default_equivalent_to_bare_torchrun():
    """benchmarks/launchers.py, its cells mode on one real cell: it runs, prints the table, and bare torchrun and
    the default launcher give bitwise the same losses and grad norms (its ratios are for a quiet machine, not here)."""
    script = Path(__file__).parent.parent / "benchmarks" / "launchers.py"
    out = subprocess.run(
        [sys.executable, str(script), "cells", "--repeat", "1", "--cells", "llama3-dp2-eager", "--launchers", "auto"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "losses and grad norms bitwise identical to bare torchrun, every launcher, every cell, every run: True"
        in out.stdout
    ), out.stdout
    assert "verdicts: every cell passed under every launcher" in out.stdout
    rows = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("llama3-dp2-eager ")]
    assert len(rows) == 2, out.stdout  # the walls, then the training steps inside them
    (bare, auto, ratio), (bare_steps, auto_steps, ceiling) = [[float(x) for x in row] for row in rows]
    # the steps are part of each wall, and the ceiling (bare wall / steps) is above the ratio reached
    assert 0 < auto_steps < auto and 0 < bare_steps < bare and ceiling > ratio, out.stdout


@pytest.mark.e2e
def test_the_profile_benchmark_reuses_the_baseline_warm_and_states_torchtitans_own_time():
    """benchmarks/launchers.py, its profile mode on one cell and its baseline: torchrun fresh, default cold, default
    warm; the warm run keeps the baseline (shown "kept", not its old wall) and torchtitan's own work in the warm
    run's jobs (rank 0's log) holds the steps and is inside the torchrun job's wall. (Not the forked job's record
    wall: that clock starts once the ranks are forked, and a forked rank, its imports done, logs at once.)"""
    script = Path(__file__).parent.parent / "benchmarks" / "launchers.py"
    out = subprocess.run(
        [sys.executable, str(script), "profile", "--select", "llama3-tp2-eager and not fsdp2"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.stdout.splitlines()
        if line.startswith(("llama3-tp2-eager ", "baseline-llama3-eager "))
    }
    assert rows["baseline-llama3-eager"][2:] == ["kept", "-", "-"], out.stdout  # not run warm: no time of its own
    fresh, cold, warm, work, steps = map(float, rows["llama3-tp2-eager"])
    assert 0 < steps < work < fresh and cold > 0 and warm > 0, out.stdout
    jobs = next(line for line in out.stdout.splitlines() if line.startswith("jobs run (and kept"))
    assert re.findall(r"(\d+) \((\d+)\)", jobs.split(")", 1)[1]) == [("2", "0"), ("2", "0"), ("1", "1")], jobs
    assert "floor: torchtitan's own work in the default, warm run is " in out.stdout


def test_context_parallel_on_cpu_ranks_trains_like_its_baseline_and_chunk_local_attention_is_killed(pytester):
    """CP 2 on gloo ranks (the shim's ring attention for the CPU SDPA kernel): the cell shows its ring (the key/value
    chunks rotated over both ranks, a query chunk of half the sequence) and trains like the one-rank baseline within
    its lane; the upstream bug where CP shards the sequence but attention stays within each rank's chunk (torchtitan
    issue 2808) is killed by that evidence, and the per-parameter numerics see it too."""
    runs = []
    for mutants in ([], ["--simplefsdp-mutants=cp_attention_local"]):  # (the second reuses the kept baseline)
        runs.append(pytester.path / f"run{len(runs)}.json")
        result = pytester.runpytest_subprocess(
            "--simplefsdp-matrix",
            "--simplefsdp-profile=cpu",
            "-k",
            "llama3-cp2-eager",
            *mutants,
            f"--simplefsdp-json={runs[-1]}",
            f"--simplefsdp-artifacts={pytester.path / 'runs'}",
            timeout=1200,
        )
        result.assert_outcomes(passed=1)
    (cell,) = run_doc(runs[0])["cells"]
    assert cell["status"] == "passed" and cell["numerics"]["lane"] == "close", cell["numerics"]
    assert 0 < cell["numerics"]["max_rel_diff"] <= 2.0e-4  # another order of the attention's sums, inside the lane
    ring = [e for e in cell["evidence"] if "effects.cp_" in e["expected"]]
    assert [e["expected"] for e in ring] == [
        "effects.cp_ring = 2 on every rank",
        "effects.cp_chunk_seq = 128 on every rank",
    ]
    assert all(e["ok"] for e in ring), ring
    (mutated,) = run_doc(runs[1])["mutants"]
    assert (mutated["mutation"], mutated["killed_by"]) == ("killed", "evidence (cp=2)")
    assert "expected effects.cp_ring = 2 on every rank, saw none" in mutated["error_line"]
    assert mutated["also_killed_by"].startswith("numerics (grad_norm): layers.0.attention."), mutated["also_killed_by"]


@pytest.mark.e2e
def test_a_planted_broken_graph_pass_is_named_by_the_compiler_bisection(pytester, monkeypatch):
    """torchtitan with a miscompiling graph pass (the shim's mutant graph_pass_corrupts_node, in every rank's
    environment: canonicalize_graph_pass turns the traced step's first aten.add into an aten.sub). The traced cell
    fails its numerics; --simplefsdp-bisect=compiler walks the ladder (eager, then traced with no graph pass, both
    passing), turns graph_trainer's passes off one at a time (only the planted one makes it pass) and names it."""
    monkeypatch.setenv("SIMPLEFSDP_MUTANT", "graph_pass_corrupts_node")
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=cpu",
        "matrix/cpu.yaml::llama3-dp2-aot_fx_trace-mp_default",
        "--simplefsdp-bisect=compiler",
        "--simplefsdp-confirm=1",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        timeout=1800,
    )
    result.assert_outcomes(failed=1)
    (found,) = json.loads(out.read_text())["bisections"]
    assert found["culprits"] == ["canonicalize_graph_pass"], found
    assert found["found"].startswith(
        "fails with pass canonicalize_graph_pass on, passes with it off; with only it on it fails; "
        "aot_fx_trace with no graph pass passes; eager passes"
    )
    outcomes = {p["version"]: p["outcome"] for p in found["probes"]}
    assert outcomes.pop("without canonicalize_graph_pass") == "passes"
    assert outcomes.pop("eager") == outcomes.pop("aot_fx_trace with no graph pass") == "passes"
    assert outcomes.pop("only canonicalize_graph_pass on") == "fails"
    assert set(outcomes.values()) == {"fails"}  # every other pass off: still the numerics failure
    assert "tag_with_memory_policy_pass" in found["passes"] and "regional_inductor_pass" in found["passes"]
    result.stdout.fnmatch_lines(["*simplefsdp bisect compiler: cpu::llama3-dp2-aot_fx_trace-mp_default: fails with*"])
