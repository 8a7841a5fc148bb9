"""Step 6 without a baseline: the exact invariants of every optimizer step, read from every rank's probe records
(``steps.rank<R>.jsonl``, written by the shim's training probe). They hold for any correct data-parallel training,
whatever the layout, so they are checked bit for bit on every cell that runs with the probe:

* every parameter shard with a nonzero gradient and a nonzero learning rate changed in the step, on every rank;
* the copies of a piece of a parameter (ranks that hold the same piece: across ``dp_replicate``, and across any
  mesh dimension the parameter is replicated on) are bitwise equal after every step;
* every rank ran the same number of optimizer and scheduler steps (one each per training step);
* the learning rate is the same on every rank.

A violation names the rank, the parameter and the step. The same records give each parameter's update norm per
step (the root of the summed squares of its distinct pieces' updates), which numerics.compare_params compares
with the baseline's after step 1, where MoE routing flips make gradients diverge but updates stay close."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import probe_folder

CHANGED, GRAD, LR, HASH, PIECE, UPDATE_SQ = range(6)  # the fields of a parameter's entry in a step record


@dataclass
class Invariants:
    """What the records show: the steps checked, on which ranks, the first violation (None: all hold)."""

    ranks: list = field(default_factory=list)
    steps: int = 0
    params: int = 0  # parameter shards checked per step, summed over ranks
    violation: str | None = None
    check: str | None = None  # changed, replicas, steps, lr: which invariant failed

    def record(self):
        return {
            "ranks": self.ranks,
            "steps": self.steps,
            "params": self.params,
            "violation": self.violation,
            "check": self.check,
        }


def read_steps(log_dir) -> dict:
    """rank -> step -> its record, from the ranks' steps.rank<R>.jsonl (a line cut by a kill is skipped)."""
    out: dict = {}
    for path in sorted(probe_folder(log_dir).glob("steps.rank*.jsonl")):
        rank = int(path.name.split(".")[1].removeprefix("rank"))
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                out.setdefault(rank, {})[int(rec["step"])] = rec
            except (ValueError, KeyError, TypeError):
                continue
    return out


def check(log_dir, world: int) -> Invariants:
    """The invariants of a green cell's run; ``world``: the ranks that must have recorded their steps."""
    records = read_steps(log_dir)
    out = Invariants(ranks=sorted(records))
    missing = [r for r in range(world) if r not in records]
    if missing:
        out.check = "steps"
        out.violation = f"the training probe recorded no optimizer step on ranks {', '.join(map(str, missing))}" + (
            f" (it did on ranks {', '.join(map(str, out.ranks))})" if out.ranks else ""
        )
        return out
    steps = sorted(set().union(*(set(s) for s in records.values())))
    out.steps = len(steps)
    for step in steps:
        for found in (
            _counts(records, step),
            _learning_rates(records, step),
            _changed(records, step, out),
            _replicas(records, step),
        ):
            if found:
                out.check, out.violation = found
                return out
    return out


def _counts(records, step):
    """Each rank recorded this step, having run one optimizer and one scheduler step per training step since it
    started (a run resumed from a checkpoint starts counting at its first step)."""
    for rank in sorted(records):
        rec = records[rank].get(step)
        if rec is None:
            return "steps", f"rank {rank} recorded no optimizer step at step {step}"
        want = step - min(records[rank]) + 1  # (a step's record is written after its scheduler step)
        for what in ("optimizer_steps", "scheduler_steps"):
            if rec.get(what) != want:
                return "steps", (
                    f"rank {rank} ran {rec.get(what)} {what.replace('_', ' ')} by the end of step {step} "
                    f"(one per training step: {want})"
                )
    return None


def _learning_rates(records, step):
    seen = {}
    for rank in sorted(records):
        seen.setdefault(tuple(records[rank][step].get("lr") or ()), []).append(rank)
    if len(seen) > 1:
        parts = "; ".join(f"{list(lr)} on ranks {', '.join(map(str, ranks))}" for lr, ranks in seen.items())
        return "lr", f"the learning rate differs between ranks at step {step}: {parts}"
    return None


def _changed(records, step, out):
    for rank in sorted(records):
        params = records[rank][step].get("params", {})
        out.params += len(params)
        for fqn, entry in params.items():
            lr = entry[LR]
            if entry[GRAD] and lr and not entry[CHANGED]:
                return "changed", (
                    f"rank {rank}: {fqn} did not change in the optimizer step of step {step} "
                    f"(its gradient there is nonzero, learning rate {lr:g})"
                )
    return None


def _replicas(records, step):
    """The copies of each piece of each parameter (same FQN and piece on several ranks) are bitwise equal."""
    copies = {}
    for rank in sorted(records):
        for fqn, entry in records[rank][step].get("params", {}).items():
            copies.setdefault((fqn, entry[PIECE]), []).append((rank, entry[HASH]))
    for (fqn, piece), held in copies.items():
        first_rank, first = held[0]
        other = next(((r, h) for r, h in held[1:] if h != first), None)
        if other:
            where = f" (piece {piece})" if piece else ""
            return "replicas", (
                f"{fqn}{where}: the copies on ranks {first_rank} and {other[0]} differ after the "
                f"optimizer step of step {step} (a replica missed or diverged from an update)"
            )
    return None


def update_norms(log_dir) -> dict:
    """step -> FQN -> the norm of the parameter's update in that step (its distinct pieces' squares summed)."""
    out: dict = {}
    for _rank, steps in sorted(read_steps(log_dir).items()):
        for step, rec in steps.items():
            pieces = out.setdefault(step, {})
            for fqn, entry in rec.get("params", {}).items():
                pieces.setdefault(fqn, {}).setdefault(entry[PIECE], entry[UPDATE_SQ])
    return {step: {fqn: math.sqrt(sum(p.values())) for fqn, p in params.items()} for step, params in out.items()}


def stats_of(log_dir) -> dict:
    """The update norms in numerics.read_param_stats' shape (kind -> step -> FQN -> value), or {} without records."""
    norms = update_norms(Path(log_dir))
    return {"update_norm": norms} if norms else {}
