"""Between results and verdict: evidence that a cell's layout reaches all of its model, not some of it.

A degree that lays out one parameter as its label says and leaves the rest replicated trains the same (a gradient
all-reduced instead of reduce-scattered), so "some parameter is sharded over fsdp" proves nothing about the memory
FSDP exists to save. Here each degree is read per parameter on every rank, from the probe's record of each
parameter's placements (shim/effects.py ``params``): the share laid out as the label says, by count and by bytes,
must be all of it, except the parameters the layout itself keeps out of a degree, which the target names in one
place (``Rule``) with the reason. Pipeline stages must partition the model's blocks. And the bytes each rank holds in
parameters, gradients and optimizer state after step 1 must be what the layout implies: each parameter's bytes
divided by the degrees that split it, within a padding allowance (uneven shards: two slices of such a parameter).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..degrees import PLACED
from .evidence import Evidence


@dataclass(frozen=True)
class Rule:
    """How a layout lays out some of its parameters for one degree, other than its label says: over ``size(axes)``
    ranks instead, or not at all (``size`` None: exempt). ``outside``: the rule is for the parameters that match
    none of ``patterns``. ``when(axes)``: the cells it holds in."""

    axis: str
    patterns: tuple
    why: str
    size: Callable | None = None
    outside: bool = False
    when: Callable = field(default=lambda axes: True)

    def covers(self, fqn: str, axes: dict) -> bool:
        hit = any(fnmatch.fnmatchcase(fqn, p) for p in self.patterns)
        return (hit != self.outside) and self.when(axes)


def wanted(degree, fqn: str, axes: dict, rules) -> tuple[int | None, Rule | None]:
    """The size a parameter should be laid out over for ``degree`` (None: the layout exempts it), and the rule."""
    for rule in rules:
        if rule.axis == degree.axis and rule.covers(fqn, axes):
            return (None if rule.size is None else int(rule.size(axes))), rule
    return degree.size(axes), None


def _params(record) -> dict:
    return record.get("effects", {}).get("params") or {}


def _bytes(entry) -> int:
    shape, itemsize = entry[0], entry[1]
    return math.prod(shape) * itemsize


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))


def degree_evidence(axes: dict, records: dict, ranks, rules=(), degrees=PLACED) -> list:
    """Per degree of the label: every parameter of every rank laid out over the label's size (or its rule's)."""
    out = []
    for degree in degrees:
        if degree.axis not in axes:
            continue
        size = degree.size(axes)
        label = f"{degree.axis}={axes[degree.axis]}"
        exempt: dict = {}
        checked: dict = {}
        wrong: dict = {}  # rule.why -> fqns; rank -> (params, bytes, bytes right)
        for rank in ranks:
            n = good = total = right = 0
            for fqn, entry in _params(records.get(rank, {})).items():
                want, rule = wanted(degree, fqn, axes, rules)
                if want is None:  # exempt by its rule
                    exempt.setdefault(rule.why if rule else "", set()).add(fqn)
                    continue
                got = degree.of(entry[3])
                n, total = n + 1, total + _bytes(entry)
                if got == want:
                    good, right = good + 1, right + _bytes(entry)
                else:
                    wrong.setdefault((fqn, got, want), []).append(rank)
            checked[rank] = (n, good, total, right)
        expected = f"every parameter {degree.words(size)}"
        if exempt:
            expected += " (exempt: " + "; ".join(f"{len(f)} by rule: {why}" for why, f in exempt.items()) + ")"
        if not any(n for n, *_ in checked.values()):  # nothing in its scope: a degree of 1 holds, a larger one not
            seen = "no parameter in its scope" if exempt else "no parameter record"
            out.append(Evidence(label, expected, f"{seen} on ranks {_ranks(ranks)}", size == 1 and bool(exempt)))
            continue
        worst = min(checked, key=lambda r: (checked[r][1] - checked[r][0], checked[r][3] / max(checked[r][2], 1)))
        n, good, total, right = checked[worst]
        share = f"{good} of {n} parameters, {100 * right / max(total, 1):.1f}% of bytes"
        if not wrong:
            out.append(Evidence(label, expected, f"{share}, on ranks {_ranks(ranks)}", True))
            continue
        shown = [
            f"{fqn} over {got}{'' if want == size else f' (its rule: {want})'} on ranks {_ranks(rs)}"
            for (fqn, got, want), rs in sorted(wrong.items(), key=lambda kv: kv[0][0])
        ]
        more = f"; and {len(shown) - 3} more" if len(shown) > 3 else ""
        out.append(Evidence(label, expected, f"{share} on rank {worst}: " + "; ".join(shown[:3]) + more, False))
    return out


def stage_evidence(axes: dict, records: dict, ranks) -> Evidence:
    """Pipeline stages as a partition of the model's blocks: ``pp`` distinct sets over the ranks, no block in two
    of them, every block of the model in one."""
    label, pp = f"pp={axes['pp']}", int(axes["pp"])
    held = {r: tuple(records.get(r, {}).get("effects", {}).get("layers") or ()) for r in ranks}
    total = next(
        (
            records[r]["effects"].get("model_layers")
            for r in ranks
            if records.get(r, {}).get("effects", {}).get("model_layers")
        ),
        None,
    )
    expected = f"{pp} stages holding each of the model's {total or '?'} blocks once"
    stages = sorted(set(held.values()))
    seen = "; ".join(
        f"blocks {','.join(s) or 'none'} on ranks {_ranks(r for r in ranks if held[r] == s)}" for s in stages
    )
    count: dict = {}
    for s in stages:
        for block in s:
            count[block] = count.get(block, 0) + 1
    twice = sorted((b for b, n in count.items() if n > 1), key=int)
    missing = [str(b) for b in range(total or 0) if str(b) not in count]
    problems = (
        ([f"{len(stages)} distinct stages"] if len(stages) != pp else [])
        + ([f"blocks {','.join(twice)} on more than one stage"] if twice else [])
        + ([f"blocks {','.join(missing)} on none"] if missing else [])
        + (["the model's block count not recorded"] if not total else [])
    )
    return Evidence(label, expected, "; ".join(problems + [seen]), not problems)


def expected_bytes(axes: dict, params: dict, rules=(), degrees=PLACED) -> tuple[int, int]:
    """(the bytes a rank holding ``params`` should hold under the label, the padding allowance): each parameter's
    bytes over the sizes of the degrees that split it (its rules' sizes; exempt: 1); two slices of a parameter whose
    split may be uneven (a dimension the split's size does not divide)."""
    total, allowance = 0.0, 0
    for fqn, entry in params.items():
        factor = 1
        for degree in degrees:
            if degree.shards:
                want, _ = wanted(degree, fqn, axes, rules)
                factor *= want or 1
        size = _bytes(entry)
        total += size / factor
        uneven = [size // d for d in entry[0] if d and d % factor]  # a dimension the split may not divide evenly
        if factor > 1 and uneven:
            allowance += 2 * max(uneven)
    return round(total), allowance


@dataclass(frozen=True)
class Memory:
    """Bytes per rank after step 1 against what the layout implies."""

    model_bytes: int  # every parameter of the model once (over the ranks' records)
    ranks: dict  # rank -> {params, grads, optimizer, peak, expected, allowance}

    def ratio(self) -> float:
        """The rank furthest from its expected parameter bytes: its held / expected."""
        ratios = [r["params"] / r["expected"] for r in self.ranks.values() if r["expected"]]
        return max(ratios, key=lambda x: abs(x - 1)) if ratios else math.nan

    def problems(self) -> list:
        out = []
        for rank, r in sorted(self.ranks.items()):
            for kind, want, slack in (
                ("params", r["expected"], r["allowance"]),
                ("grads", r["expected"], r["allowance"]),
                ("optimizer", 2 * r["expected"], 2 * r["allowance"]),
            ):
                if kind == "optimizer" and not r.get("adam"):
                    continue  # AdamW's two moments per parameter; another optimizer's state is only reported
                if abs(r[kind] - want) > slack:
                    unlike = r.get("grads_unlike") if kind == "grads" else None
                    which = f" ({', '.join(unlike[:2])} elements: a gradient unlike its parameter)" if unlike else ""
                    out.append(f"rank {rank} holds {r[kind]} bytes of {kind}, expected {want} (+-{slack}){which}")
        return out

    def evidence(self) -> Evidence:
        most = max(r["expected"] for r in self.ranks.values())
        expected = (
            f"each rank's parameter, gradient and AdamW state bytes as the layout implies (at most "
            f"{most} of the model's {self.model_bytes} parameter bytes, {most / self.model_bytes:.3f})"
        )
        problems = self.problems()
        if problems:
            more = f"; and {len(problems) - 2} more" if len(problems) > 2 else ""
            return Evidence("memory", expected, "; ".join(problems[:2]) + more, False)
        return Evidence(
            "memory",
            expected,
            f"within the padding allowance on ranks {_ranks(sorted(self.ranks))} (held / expected: {self.ratio():.4f})",
            True,
        )

    def record(self) -> dict:
        held = max(r["params"] for r in self.ranks.values())
        most = max(r["expected"] for r in self.ranks.values())
        ratio = self.ratio()
        return {
            "model_bytes": self.model_bytes,
            "share": held / self.model_bytes,
            "expected_share": most / self.model_bytes,
            "ratio": None if math.isnan(ratio) else ratio,
            "ranks": {str(k): v for k, v in sorted(self.ranks.items())},
        }


def memory(axes: dict, records: dict, ranks, rules=(), degrees=PLACED) -> Memory | None:
    """The memory of the ranks that recorded it (None: no rank did, e.g. a target without the probe)."""
    model: dict = {}
    out: dict = {}
    for rank in ranks:
        effects = records.get(rank, {}).get("effects", {})
        held, params = effects.get("memory"), _params(records.get(rank, {}))
        if not held or not params:
            continue
        for fqn, entry in params.items():
            model.setdefault(fqn, _bytes(entry))
        expected, allowance = expected_bytes(axes, params, rules, degrees)
        adam = any(name.startswith("Adam") for name in held.get("optimizer_class", ()))
        out[rank] = {
            **{k: held.get(k) for k in ("params", "grads", "optimizer", "peak", "grads_unlike")},
            "expected": expected,
            "allowance": allowance,
            "adam": adam,
        }
    if not out:
        return None
    return Memory(sum(model.values()), out)
