"""Log parsing on real rank logs (tests/data: stderr of real CPU cells, cut to the last traceback)."""

import pytest

from pytest_simplefsdp.judge.known import signature
from pytest_simplefsdp.judge.results import (
    CRASH_HINT,
    cell_losses,
    classify,
    fallback_error,
    last_exception,
    parse_losses,
    read_text,
)

from helpers import DATA


@pytest.mark.parametrize(
    "log, line, cls",
    [
        ("titan02_hop_side_effect.log", "torch._dynamo.exc.Unsupported: HOP: Unsafe side effect", "compile"),
        # an eager cell: `torch._disable_dynamo` wrappers put eval_frame.py on its stack; still not compile
        ("titan02_eager_ac_batch_mismatch.log", "RuntimeError: matrix batch sizes have to match", "runtime"),
        (
            "titan03_graphpp_none_grad.log",
            "TypeError: _dtensor__new__(): argument 'local_tensor' (position 2) must be Tensor, not NoneType",
            "runtime",
        ),
    ],
)
def test_exception_line_and_class_from_real_logs(log, line, cls):
    text = read_text([DATA / log])
    assert "[rank" not in text.split("Traceback")[1][:200]  # torchrun's per-line prefix is gone
    first, message, frames = last_exception(text)
    assert first == line
    assert classify(first, frames, 1) == cls


def test_hop_signature_keeps_the_explanation():
    _, message, _ = last_exception(read_text([DATA / "titan02_hop_side_effect.log"]))
    sig = signature(message)
    assert sig.startswith("torch._dynamo.exc.Unsupported: HOP: Unsafe side effect")
    assert "Mutating a variable from outside the scope of this HOP is not supported" in sig
    assert "ExpertParallel" in sig
    assert "in _token_dispatch self.input_splits = input_splits.tolist()" in sig  # the seed's trigger line


def test_dynamo_message_with_double_blank_lines_keeps_the_user_code():
    """torch 2.10 puts two blank lines between dynamo's sections; the trigger line is at the end."""
    text = read_text([DATA / "titan02_hop_side_effect_torch210.log"])
    first, message, _ = last_exception(text)
    assert first == (
        "torch._dynamo.exc.Unsupported: HigherOrderOperator: Mutating a variable not in the current scope (SideEffects)"
    )
    assert "gb0067" in message and "from user code:" in message
    assert message.rstrip().endswith("self.input_splits = input_splits.tolist()")
    assert "TORCHDYNAMO_VERBOSE" not in message


def test_native_crash_hint_and_losses():
    text = read_text([DATA / "titan03_gloo_abort.log"])
    assert [m.group(0) for m in CRASH_HINT.finditer(text)] == ["terminate called without an active exception"]
    assert parse_losses(text) == {1: 8.02984}
    assert classify("rank 3 killed by SIGABRT", "", -6) == "crash"


def test_losses_with_colours_nan_and_repeats():
    text = (
        "\x1b[31mstep:  1  loss:  8.09302  grad_norm: 1\x1b[39m\n"
        "step:  1  loss:  9.00000\nstep:  2  loss:     nan  grad_norm: nan\n"
    )
    losses = parse_losses(read_text([]) + text)
    assert losses[1] == 8.09302 and losses[2] != losses[2]


def test_pp_stages_without_the_loss_are_not_the_cell_losses():
    """torchtitan 0.2 logs `loss: -1.0000` on PP stages before the last; the loss is the last stage's."""
    first_stage = "step:  1  loss: -1.0000  grad_norm: 7.9\nstep:  2  loss: -1.0000  grad_norm: 7.1\n"
    last_stage = "step:  1  loss:  8.1324  grad_norm: 7.9\nstep:  2  loss:  7.9001  grad_norm: 7.1\n"
    losses, grads = cell_losses({0: first_stage, 1: first_stage, 2: last_stage, 3: last_stage})
    assert losses == {1: 8.1324, 2: 7.9001} and grads == {1: 7.9, 2: 7.1}
    assert cell_losses({0: first_stage}) == ({}, {})  # only sentinels: no loss was logged
    assert cell_losses({0: "step:  1  loss: -1.0000\nstep:  2  loss:  0.5\n"})[0] == {1: -1.0, 2: 0.5}  # a real -1
    # torchtitan 0.2.2 sums -1 over its accumulation steps: -2.0 with two, on every stage before the last
    summed = first_stage.replace("-1.0000", "-2.00000")
    assert cell_losses({0: summed, 1: summed, 2: last_stage})[0] == losses


def test_a_heap_abort_names_glibcs_message_and_where_python_was():
    """A torchtitan 0.2 EP cell (gloo all_to_all) died of SIGABRT after glibc's heap check; the record said only
    "rank 0 killed by SIGABRT". It now carries the message and faulthandler's innermost frames."""
    from pytest_simplefsdp.judge.results import build_result
    from pytest_simplefsdp.launch.spec import LaunchOutcome
    from pytest_simplefsdp.spec.cells import Cell

    log = DATA / "titan02_ep_heap_abort.log"
    outcome = LaunchOutcome(exit_codes={0: -6, 1: -15}, first_failed_rank=0, rank_logs={0: [str(log)]})
    res = build_result(Cell("ep-eager", {"mode": "x"}, 2, False, "m.yaml:1"), outcome, log.parent)
    assert res.failure_class == "crash" and res.failing_rank == 0
    assert res.error_line == "rank 0 killed by SIGABRT: malloc(): unaligned tcache chunk detected"
    assert (
        "Python was in (faulthandler): torch/_ops.py:1209 __call__ <- torch/distributed/_functional_collectives.py"
        ":540 all_to_all_single_autograd <- torchtitan/distributed/expert_parallel.py:110 _token_dispatch"
        in res.error_text
    )


def test_an_abort_at_exit_after_an_uncaught_exception_is_the_exception():
    """torchtitan 0.2 HSDP + EP ranks failed to load the seed checkpoint (DCP's AssertionError on every rank), then
    one of them aborted at exit ("terminate called without an active exception": a joinable thread destroyed while
    the process left). The record said "rank 1 killed by SIGABRT", hiding the error a known-failure entry names; a
    rank that dies so on its own, with no Python exception, stays a crash (test_identity)."""
    from pytest_simplefsdp.judge.results import build_result
    from pytest_simplefsdp.launch.spec import LaunchOutcome
    from pytest_simplefsdp.spec.cells import Cell

    log = DATA / "titan02_hsdp_ep_checkpoint_load.log"
    outcome = LaunchOutcome(exit_codes={0: 1, 1: -6}, first_failed_rank=1, rank_logs={1: [str(log)]})
    res = build_result(Cell("dpr2-dp2-ep2", {"mode": "x"}, 2, False, "m.yaml:1"), outcome, log.parent)
    assert res.failure_class == "runtime" and res.failing_rank == 1
    assert (
        res.error_line
        == "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1, 2, 3])"
    )
    assert "mismatch sizes torch.Size([2, 256, 256]) vs torch.Size([4, 256, 256])" in res.error_text


def test_a_framed_cli_refusal_is_the_error_line_not_its_frame():
    """torchtitan after PR 4088 (grain) refuses --dataloader.dataset_path in tyro's framed box: the line that says
    so is the error, not the box's bottom border (a bisection over torchtitan commits showed it as
    "no error message; last line: ╰────")."""
    text = read_text([DATA / "titan03_grain_unrecognized_option.log"])
    assert fallback_error(text) == "Unrecognized options: --dataloader.dataset_path,"
