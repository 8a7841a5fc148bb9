"""Step 5 for a pull request (--simplefsdp-base): a failure of the PR's run judged against the same cell on the
PR's base, as PyTorch's Dr. CI sorts failures. Only a new failure fails the gate; one the base shares (broken
trunk), one whose runs disagree (flaky) and one an entry expects (known) are reported, not gated."""

from __future__ import annotations

from dataclasses import dataclass

from ..kinds import GateClass, Status
from .identity import identity
from .numerics import compare, compare_params


@dataclass(frozen=True)
class Base:
    """The base a PR's failures are rerun on: the ref as given, its commit, and the checkout it is a commit of."""

    ref: str
    commit: str  # 12 hex digits
    repo: str
    # the ids of the known-failures file as the base has it, where that file is part of the checkout (None: it is
    # not, and one file judges both sides): an xfail by an entry the base lacks is the PR's own claim
    entries: tuple | None = None

    def about(self) -> dict:
        return {
            "ref": self.ref,
            "commit": self.commit,
            "repo": self.repo,
            **({"entries": list(self.entries)} if self.entries is not None else {}),
        }

    def name(self) -> str:
        """How reports name it: the ref and its commit, or the commit alone where the ref is one."""
        return (
            self.commit
            if self.commit.startswith(self.ref) or self.ref.startswith(self.commit)
            else f"{self.ref} ({self.commit})"
        )


ADDED = "xfailed by an entry this PR adds"  # a known failure whose entry the base's known-failures file lacks
UNGATED = (GateClass.BROKEN_TRUNK, GateClass.FLAKY)  # failures a PR gate lets through: failing, all the same
# the classes in the order a report lists them (Dr. CI's), and what each means for the PR
ORDER = (GateClass.NEW, GateClass.BROKEN_TRUNK, GateClass.FLAKY, GateClass.KNOWN)
MEANING = {
    GateClass.NEW: "fails here, passes on the base (or fails there differently): this PR broke it; fails the gate",
    GateClass.BROKEN_TRUNK: "fails on the base too, with the same signature: not this PR's doing",
    GateClass.FLAKY: "one of its runs here passed, or the base failed the same way and passed: not gated",
    GateClass.KNOWN: "a known-failures entry expects it",
}


def shut(counts: dict) -> bool:
    """Whether a run's counts per class shut the gate: a new failure, the one class that fails it."""
    return bool(counts[str(GateClass.NEW)])


def legend() -> str:
    return "only new failures fail the gate; " + "; ".join(
        f"{c}: {m}" for c, m in MEANING.items() if c != GateClass.NEW
    )


def on_the_base(gate: str, record: dict) -> str:
    """What a failure's base record says, in words (a known failure is not rerun there)."""
    if gate == GateClass.KNOWN:
        return "not rerun" + ("; its entry is added by this PR" if record.get("added") else "")
    if not record.get("runs"):
        return f"did not run: {'; '.join(record['not_run'])}" if record.get("not_run") else "not rerun"
    if record.get("passed") == record.get("runs"):
        return f"passed {record['runs']} of {record['runs']}"
    return f"failed {record['runs'] - record['passed']} of {record['runs']}: " + "; ".join(
        record.get("signatures") or []
    )


def base_record(results: list, base: Base) -> dict:
    """The cell's runs on a PR's base (none: not run there), as its record keeps them."""
    ran = [r for r in results if not r.not_run]
    failed = [r for r in ran if r.status != Status.PASSED]
    return {
        **base.about(),
        "runs": len(ran),
        "passed": len(ran) - len(failed),
        "signatures": list(dict.fromkeys(r.signature or identity(r) for r in failed)),
        "lines": list(dict.fromkeys(r.error_line or "" for r in failed)),
        "folders": [r.log_dir for r in results],
        "not_run": [r.error_line for r in results if r.not_run],
    }


def gate_class(mine: str, flaky: bool, verdict: str, record: dict) -> tuple[GateClass, str]:
    """(class, verdict) of a PR's new failure with signature ``mine`` (judge.identity; ``flaky``: one of its own runs
    passed, as its ``verdict`` says), given the base's record (base_record: its runs there, or none). The base
    clears a failure only with the same signature: failing every run with it is broken trunk, failing some runs
    with it and passing others is flaky; a base that passes some runs and fails others with another error says
    nothing about this one."""
    at = f"base {Base(record['ref'], record['commit'], record['repo']).name()}"
    runs, passed, theirs = record.get("runs", 0), record.get("passed", 0), record.get("signatures") or []
    if flaky:
        return GateClass.FLAKY, f"{verdict} (not rerun on {at})"
    if not runs:
        why = "; ".join(record.get("not_run") or []) or "it did not run"
        return GateClass.NEW, f"new: fails here; on {at} the cell could not run ({why}), so nothing clears it"
    if passed == runs:
        return GateClass.NEW, f"new: fails here, passes on {at} ({runs} of {runs} runs)"
    if passed and mine in theirs:
        return GateClass.FLAKY, f"flaky: fails here, and on {at} failed the same way and passed {passed} of {runs} runs"
    if passed:
        return GateClass.NEW, (
            f"new: fails here; on {at} passed {passed} of {runs} runs and failed otherwise differently; here: "
            f"{mine}; base: {'; '.join(theirs)}"
        )
    if theirs == [mine]:
        return (
            GateClass.BROKEN_TRUNK,
            f"broken trunk: fails on {at} too, with the same signature ({runs} of {runs} runs): {mine}",
        )
    return GateClass.NEW, f"new: fails on {at} too, but differently; here: {mine}; base: {'; '.join(theirs)}"


def classify(result, base_runs: list, base: Base) -> tuple[GateClass, str, dict]:
    """(class, verdict, the base's record) of a PR's new failure (``result``, after its confirming runs) given the
    same cell's runs on the base."""
    record = base_record(base_runs, base)
    mine = result.signature or identity(result)
    return (*gate_class(mine, result.flaky, result.verdict, record), record)


def numerics_vs_base(mine, theirs, lane, base: Base) -> dict:
    """A passing cell (``mine``: its losses and per-parameter records, run.baselines.param_stats) against the same
    cell on the PR's base (``theirs``), both as {"losses", "stats"}: the largest relative change of its losses and of
    every parameter's gradient, update and parameter norms (any step), how many loaded weights differ, and whether
    the change is beyond the cell's own tolerance (``lane``, as its baseline comparison narrows it). A PR that moves
    every layout alike passes every cell-vs-baseline check, where both sides move: only this shows it."""
    loss_ok, losses = compare(mine["losses"], theirs["losses"], lane)
    params_ok, params = compare_params(mine["stats"], theirs["stats"], lane)
    params_ok = params_ok or not (mine["stats"] or theirs["stats"])  # a target whose ranks record no parameters
    size = {"loss": losses["max_rel_diff"]}
    for kind in ("grad_norm", "update_norm", "param_norm"):
        size[kind] = max(params["max_rel_diff"].get(kind, {}).values(), default=0.0)
    weights = params.get("weights_differing", 0)
    changed = bool(weights or any(size.values()) or losses.get("extra_steps"))
    beyond = changed and not (loss_ok and params_ok)
    line = None
    if changed:
        moved = ", ".join(f"{k.replace('_', ' ')} {v:.2e}" for k, v in size.items() if v)
        line = (
            f"numerics changed vs the base {base.name()}: largest relative change {moved or 'none'}"
            + (f", {weights} loaded weight(s) differ" if weights else "")
            + (
                f"; beyond the cell's tolerance (lane {lane.name})"
                if beyond
                else f"; within the cell's tolerance (lane {lane.name})"
            )
        )
    return {
        **base.about(),
        "changed": changed,
        "beyond": beyond,
        "size": size,
        "weights_differing": weights,
        "line": line,
    }
