"""A failure's identity: what broken trunk (the same bug on the base), a cell's history and its confirming runs
compare, and what one drafted entry, one sentinel bug and one bisection follow. ``known.signature`` normalises a
failure's text for the known-failures patterns and drops what tells two bugs apart (numbers, paths, frames): any
bare ``AssertionError``, any hang, any loss mismatch were one signature each. The identity keeps them apart:
- an error: its type and message (normalised) and the innermost frame in torchtitan or torch where it was raised;
- a crash: its signal (and what C++ or glibc said) and the stack faulthandler recorded;
- a hang: the stuck rank's innermost collective and its frame;
- numerics: the first failing quantity, its step and its parameter.
``site`` (where, from the rank's log: results.error_site, crash_stack, hang_site) is read once by
results.build_result, while the logs are at hand."""

from __future__ import annotations

import re

from ..kinds import FailureClass
from .known import signature
from .results import CRASH_SITE

# numbers with a fraction or an exponent (values: a loss, a norm, a tolerance); whole numbers (steps, ranks,
# parameters' block numbers) are kept
VALUE = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?(?![\w.])")


def identity(result) -> str:
    """The identity of a failed result (``''`` for one that passed): see the module's words."""
    if not result.failure_class:
        return ""
    text = result.error_text or result.error_line or ""
    if result.failure_class == FailureClass.NUMERICS:
        return numerics_identity(result)
    site = result.site
    head = signature(text.split(CRASH_SITE)[0])
    if result.failure_class == FailureClass.HANG:
        head = re.sub(r"^timed out after N s; ranks still running: [N, ]+", "hang", head)
    return f"{head} @ {site}" if site else head


def direction(cell, baseline) -> str:
    """Which way a value left its baseline's: a doubled gradient (a sum for a mean) and a lost one (a stage that
    skipped backward) are two bugs, though both fail the same parameter at the same step; the size is not kept
    (it moves with the layout and the machine, the direction does not)."""
    if cell is None or baseline is None:
        return "on one side only"
    if cell != cell or baseline != baseline:
        return "not a number"
    return "higher" if cell > baseline else "lower"


def numerics_identity(result) -> str:
    """numerics: the check that failed first, its step, parameter and direction (a loss mismatch at step 2 and a
    router's gradient at step 1 are two bugs), or the failure's line with its values normalised but its steps
    kept."""
    rep = result.numerics or {}
    check = rep.get("check")
    params = rep.get("params")
    first = params.get("first_difference") if isinstance(params, dict) and check and check != "loss" else None
    if first:
        exact = first["kind"] == "init_checksum"  # a hash of the weights' bits: equal or not, no direction
        how = "differs" if exact else direction(first.get("cell"), first.get("baseline"))
        return f"numerics: {first['kind']} of {first['param']} at step {first['step']}, {how}"
    if check == "loss":
        step = rep.get("first_differing_step")
        row: dict = next((r for r in rep.get("steps") or [] if r.get("step") == step), {})
        return f"numerics: loss at step {step}, {direction(row.get('cell'), row.get('baseline'))}"
    line = result.error_line or ""
    return "numerics: " + VALUE.sub("N", re.sub(r"\b0x[0-9a-fA-F]+\b", "0xADDR", line))
