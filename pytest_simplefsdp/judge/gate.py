"""Step 5 for a pull request (--simplefsdp-base): a failure of the PR's run judged against the same cell on the
PR's base, as PyTorch's Dr. CI sorts failures. Only a new failure fails the gate; one the base shares (broken
trunk), one whose runs disagree (flaky) and one an entry expects (known) are reported, not gated."""

from __future__ import annotations

from dataclasses import dataclass

from ..kinds import GateClass, Status
from .known import signature


@dataclass(frozen=True)
class Base:
    """The base a PR's failures are rerun on: the ref as given, its commit, and the checkout it is a commit of."""

    ref: str
    commit: str  # 12 hex digits
    repo: str

    def about(self) -> dict:
        return {"ref": self.ref, "commit": self.commit, "repo": self.repo}

    def name(self) -> str:
        """How reports name it: the ref and its commit, or the commit alone where the ref is one."""
        return self.commit if self.commit.startswith(self.ref) or self.ref.startswith(self.commit) \
            else f"{self.ref} ({self.commit})"


def classify(result, base_runs: list, base: Base) -> tuple[GateClass, str, dict]:
    """(class, verdict, the base's record) of a PR's new failure (``result``, after its confirming runs) given the
    same cell's runs on the base."""
    mine = result.signature or signature(result.error_text or result.error_line)
    ran = [r for r in base_runs if not r.not_run]
    failed = [r for r in ran if r.status != Status.PASSED]
    theirs = list(dict.fromkeys(signature(r.error_text or r.error_line) for r in failed))
    record = {**base.about(), "runs": len(ran), "passed": len(ran) - len(failed), "signatures": theirs,
              "lines": list(dict.fromkeys(r.error_line or "" for r in failed)),
              "folders": [r.log_dir for r in base_runs], "not_run": [r.error_line for r in base_runs if r.not_run]}
    at = f"base {base.name()}"
    if result.flaky:
        return GateClass.FLAKY, f"{result.verdict} (not rerun on {at})", record
    if not ran:
        why = "; ".join(record["not_run"]) or "it did not run"
        return GateClass.NEW, f"new: fails here; on {at} the cell could not run ({why}), so nothing clears it", record
    if failed and len(failed) < len(ran):
        return (GateClass.FLAKY, f"flaky: fails here, and on {at} passed {len(ran) - len(failed)} of {len(ran)} runs",
                record)
    if not failed:
        return GateClass.NEW, f"new: fails here, passes on {at} ({len(ran)} of {len(ran)} runs)", record
    if theirs == [mine]:
        return (GateClass.BROKEN_TRUNK, f"broken trunk: fails on {at} too, with the same signature "
                                        f"({len(ran)} of {len(ran)} runs): {mine}", record)
    return (GateClass.NEW, f"new: fails on {at} too, but differently; here: {mine}; base: {'; '.join(theirs)}",
            record)
