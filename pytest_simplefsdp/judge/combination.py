"""Which axis values a failure needs, from the run alone: the status page's "which combination fails" and the
update command's ``when`` both ask it. The failing cells (one signature) are set against the passing cells of the
same run: the answer is the smallest set of values the failing cells all have and no passing cell has whole (an
axis on which the failing cells differ offers the list of their values: ``tp: [2, 4]``). Among sets of one size,
the one whose values the nearest passing cells (those that differ from a failing cell in the fewest axes) lack:
eager and ``aot_fx_trace`` cells differ in two axes (``compile``, ``memory_policy``), so "one axis away" alone would
miss them."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations


@dataclass
class Needs:
    values: list  # [(axis, value or [values])]: what the failing cells need, in axis order
    separated: bool  # False: no passing cell tells them apart, so ``values`` is only what they share


def label(values) -> str:
    return " + ".join(f"{a}={'|'.join(map(str, v)) if isinstance(v, list) else v}" for a, v in values) or "(every cell)"


def distance(a: dict, b: dict) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))


def _has(cell, subset):
    return all(cell.get(a) in v if isinstance(v, list) else cell.get(a) == v for a, v in subset)


def needs(failing: list[dict], passing: list[dict]) -> Needs:
    """The axis values ``failing`` (axes of cells failing with one signature) need against ``passing``."""
    order = list(failing[0])
    items = []  # (axis, the value they share, or the list of the values they have)
    for axis in order:
        seen = list(dict.fromkeys(c.get(axis) for c in failing))
        items.append((axis, seen[0] if len(seen) == 1 else sorted(seen, key=str)))
    common = [(a, v) for a, v in items if not isinstance(v, list)]
    if not passing:
        return Needs(common, False)
    gap = min(distance(p, c) for p in passing for c in failing)
    nearest = [p for p in passing if any(distance(p, c) == gap for c in failing)]
    contrast = {a for a, v in items if any(not _has(p, [(a, v)]) for p in nearest)}
    for size in range(1, len(items) + 1):
        found = [s for s in combinations(items, size) if not any(_has(p, s) for p in passing)]
        if found:  # what the nearest passing cells lack, then shared values over lists, then axis order
            best = min(
                found,
                key=lambda s: (
                    -sum(a in contrast for a, _ in s),
                    sum(isinstance(v, list) for _, v in s),
                    [order.index(a) for a, _ in s],
                ),
            )
            return Needs(list(best), True)
    return Needs(common, False)  # a passing cell has every value they have (a flaky failure)
