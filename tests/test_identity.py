"""A failure's identity (judge.identity, issue 58 Why 4): the signature broken trunk, history and confirming runs
compare keeps what tells two bugs apart, where the known-failures signature (judge.known.signature) merges them:
where an error was raised, which collective a hang waits in, the stack of a crash, the step and parameter of a
numerics failure. Results are built by the real code path (results.build_result) from rank logs as ranks write
them."""

import signal

import pytest

from pytest_simplefsdp.judge.gate import Base, classify
from pytest_simplefsdp.judge.identity import identity
from pytest_simplefsdp.judge.known import signature
from pytest_simplefsdp.judge.results import CellResult, build_result, read_text
from pytest_simplefsdp.kinds import FailureClass, GateClass
from pytest_simplefsdp.launch.spec import LaunchOutcome
from pytest_simplefsdp.spec.cells import Cell

from helpers import DATA

SITE = "/venv/lib/python3.11/site-packages"


def traceback(*frames, error="AssertionError"):
    """A rank's log ending in a traceback through ``frames`` (file, function), innermost last."""
    lines = ["[titan] step: 1 loss: 8.0", "Traceback (most recent call last):"]
    for path, func in frames:
        lines += [f'  File "{SITE}/{path}", line 12, in {func}', "    do_it()"]
    return "\n".join([*lines, error, ""])


def stuck(*frames):
    """A rank's faulthandler dump (SIGUSR1 at the timeout), innermost first."""
    lines = ["Current thread 0x00007f0000000001 (most recent call first):"]
    lines += [f'  File "{SITE}/{path}", line 40 in {func}' for path, func in frames]
    return "\n".join(lines + [""])


def result_of(tmp_path, name, text, code=1, hang=False):
    log = tmp_path / f"{name}.log"
    log.write_text(text)
    peer = tmp_path / f"{name}-peer.log"
    peer.write_text("[titan] step: 1 loss: 8.0\n")
    outcome = LaunchOutcome(
        exit_codes={0: None if hang else -signal.SIGTERM, 1: None if hang else code},
        first_failed_rank=None if hang else 1,
        timed_out=hang,
        stuck_ranks=[1] if hang else [],
        rank_logs={0: [peer], 1: [log]},
        wall=30.0,
    )
    cell = Cell(id=name, axes={"mode": name}, world=2)
    return build_result(cell, outcome, tmp_path, expected_steps=1)


def test_two_bare_assertions_raised_in_different_places_are_two_bugs(tmp_path):
    """On the landed revision both were the signature `AssertionError`: a PR that fails one and a base that fails
    the other was broken trunk. Now: two identities, and the gate calls the PR's new."""
    a = result_of(
        tmp_path,
        "a",
        traceback(
            ("torchtitan/train.py", "train_step"), ("torch/_functorch/partitioners.py", "min_cut_rematerialization")
        ),
    )
    b = result_of(
        tmp_path,
        "b",
        traceback(("torchtitan/train.py", "train_step"), ("torch/distributed/tensor/_api.py", "redistribute")),
    )
    assert signature(a.error_text) == signature(b.error_text) == "AssertionError"  # merged by the old signature
    assert identity(a) == "AssertionError @ torch/_functorch/partitioners.py:min_cut_rematerialization"
    assert identity(b) == "AssertionError @ torch/distributed/tensor/_api.py:redistribute"
    cls, verdict, _ = classify(a, [b, b], Base("main", "0123456789ab", "/repo"))
    assert cls == GateClass.NEW and "but differently" in verdict
    cls, _, _ = classify(a, [a, a], Base("main", "0123456789ab", "/repo"))
    assert cls == GateClass.BROKEN_TRUNK


def test_the_root_cause_of_a_chained_error_names_the_site(tmp_path):
    """A compile error's last traceback ends in the backend's wrapper whatever broke; its chain's first traceback
    says where."""
    text = (
        traceback(("torch/_inductor/scheduler.py", "fuse_nodes"))
        + "\nThe above exception was the direct cause of the following exception:\n\n"
        + traceback(("torch/_dynamo/output_graph.py", "call_user_compiler"), error="BackendCompilerFailed: boom")
    )
    assert identity(result_of(tmp_path, "c", text)).endswith("@ torch/_inductor/scheduler.py:fuse_nodes")


def test_hangs_in_different_collectives_are_two_bugs(tmp_path):
    ep = result_of(
        tmp_path,
        "ep",
        stuck(
            ("torch/distributed/distributed_c10d.py", "all_to_all_single"),
            ("torchtitan/distributed/expert_parallel.py", "_token_dispatch"),
        ),
        hang=True,
    )
    fsdp = result_of(
        tmp_path,
        "fsdp",
        stuck(
            ("torch/distributed/distributed_c10d.py", "all_gather_into_tensor"),
            ("torchtitan/experiments/graph_trainer/simple_fsdp.py", "replicate_compute"),
        ),
        hang=True,
    )
    assert (ep.failure_class, fsdp.failure_class) == (FailureClass.HANG, FailureClass.HANG)
    assert signature(ep.error_line) == signature(fsdp.error_line)  # "timed out after N s; ranks still running: N"
    assert identity(ep) == (
        "hang @ torch/distributed/distributed_c10d.py:all_to_all_single from "
        "torchtitan/distributed/expert_parallel.py:_token_dispatch"
    )
    assert identity(fsdp).startswith("hang @ torch/distributed/distributed_c10d.py:all_gather_into_tensor from")


def test_crashes_keep_their_signal_and_stack(tmp_path):
    text = stuck(("torch/distributed/distributed_c10d.py", "barrier"), ("torchtitan/train.py", "close"))
    text = "terminate called without an active exception\nFatal Python error: Aborted\n\n" + text
    abort = result_of(tmp_path, "abort", text, code=-signal.SIGABRT)
    assert abort.failure_class == FailureClass.CRASH
    assert identity(abort) == (
        "rank N killed by SIGABRT: terminate called without an active exception @ "
        "torch/distributed/distributed_c10d.py:barrier <- torchtitan/train.py:close"
    )


def numerics(check, step, param=None, cell=1.0, baseline=2.0):
    r = CellResult("c", {})
    first = {"kind": check, "step": step, "param": param, "cell": cell, "baseline": baseline}
    params = {"first_difference": first} if param else {}
    steps = [{"step": step, "cell": cell, "baseline": baseline}]
    r.numerics = {"check": check, "first_differing_step": step, "params": params, "steps": steps}
    r.fail(FailureClass.NUMERICS, f"{param or 'loss'}: differs from baseline b at step {step}: 1.2345 vs 1.2346")
    return r


def test_numerics_failures_keep_their_quantity_step_and_parameter():
    loss2, loss3 = numerics("loss", 2), numerics("loss", 3)
    router = numerics("grad_norm", 1, "layers.1.moe.router.gate.weight")
    assert signature(loss2.error_line) == signature(loss3.error_line)  # merged by the old signature
    assert identity(loss2) == "numerics: loss at step 2, lower" != identity(loss3)
    assert identity(router) == "numerics: grad_norm of layers.1.moe.router.gate.weight at step 1, lower"
    # a gradient summed where it should be averaged, and one a stage never computed: one parameter, one step, two
    # bugs (the mutants reduce_scatter_sum and pp_stage_skips_backward on llama3-dp2-pp2-1F1B-eager)
    summed = numerics("grad_norm", 1, "tok_embeddings.weight", cell=2.0, baseline=1.0)
    skipped = numerics("grad_norm", 1, "tok_embeddings.weight", cell=0.0, baseline=1.0)
    assert identity(summed).endswith(", higher") and identity(skipped).endswith(", lower")
    assert identity(numerics("grad_norm", 1, "w", cell=None)).endswith(", on one side only")
    invariant = CellResult("c", {})
    invariant.fail(FailureClass.NUMERICS, "optimizer-step invariant (lr): rank 1 lr 0.002 vs 0.001 at step 2")
    assert identity(invariant) == "numerics: optimizer-step invariant (lr): rank 1 lr N vs N at step 2"


@pytest.mark.parametrize(
    "log, site",
    [
        ("titan03_graphpp_none_grad.log", "torch/distributed/tensor/_api.py:__tensor_unflatten__"),
        ("titan02_eager_ac_batch_mismatch.log", None),
        ("titan02_hop_side_effect.log", None),
    ],
)
def test_real_logs_name_a_frame_in_torch_or_torchtitan(tmp_path, log, site):
    result = result_of(tmp_path, "real", read_text([DATA / log]))
    assert result.site.startswith(("torch/", "torchtitan/")), result.site
    if site:
        assert result.site == site
    assert identity(result) == f"{signature(result.error_text)} @ {result.site}"
