"""Memory per rank as a run reports it: the bytes each rank held after step 1 (judge.layout.Memory's record in a
cell's ``memory``), as a grid column, a cell's detail line, and ``report --format memory`` (one run, or two
compared: the same cell's bytes per rank before and after)."""

from __future__ import annotations

from tabulate import tabulate

from ..spec.cells import cell_key

KINDS = ("params", "grads", "optimizer")


def short(rec) -> str:
    """A layout's grid entry: the share of the model's parameter bytes its fullest rank holds, and held / expected."""
    mem = rec.get("memory")
    if not mem:
        return ""
    # three places: a memory check that fails on a replicated norm (0.9995) must not read as ×1.00
    ratio = "" if mem.get("ratio") is None else f" ×{mem['ratio']:.3f}"
    return f"{mem['share']:.3f}{ratio}"


def column(records) -> str:
    """The grid's memory entry for one layout's cells (they share a layout: one value, unless they differ)."""
    return " / ".join(dict.fromkeys(t for t in map(short, records) if t))


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def detail(rec) -> str:
    """One line per cell: what its fullest rank holds, and against what."""
    mem = rec["memory"]
    fullest = max(mem["ranks"].values(), key=lambda r: r["params"])
    peak = "" if fullest.get("peak") is None else f", peak {mib(fullest['peak'])} MiB"
    return (
        f"memory per rank (fullest): params {mib(fullest['params'])} MiB, grads {mib(fullest['grads'])} MiB, "
        f"optimizer {mib(fullest['optimizer'])} MiB{peak}; {mem['share']:.3f} of the model's "
        f"{mib(mem['model_bytes'])} MiB of parameters, expected {mem['expected_share']:.3f}"
        + ("" if mem.get("ratio") is None else f" (held / expected {mem['ratio']:.4f})")
    )


def _index(doc):
    return {
        cell_key(run["meta"].get("profile"), run["meta"].get("tier", "real"), rec["id"]): rec
        for run in doc["runs"]
        for rec in run["cells"]
        if rec.get("memory")
    }


def render(doc, old=None) -> str:
    """Per cell and rank: bytes held (MiB) by kind, expected parameter bytes, held / expected; with ``old``, the
    older run's parameter bytes of the same cell and rank and new / old."""
    new, before = _index(doc), _index(old) if old is not None else {}
    headers = ["cell", "rank", *(f"{k} MiB" for k in KINDS), "expected MiB", "share", "held/expected"]
    if old is not None:
        headers += ["old params MiB", "new/old"]
    rows = []
    for key, rec in new.items():
        mem = rec["memory"]
        for rank, r in mem["ranks"].items():
            row = [
                rec["id"],
                rank,
                *(mib(r[k]) for k in KINDS),
                mib(r["expected"]),
                f"{r['params'] / mem['model_bytes']:.3f}",
                f"{r['params'] / r['expected']:.4f}",
            ]
            if old is not None:
                was = before.get(key, {}).get("memory", {}).get("ranks", {}).get(rank)
                row += [mib(was["params"]), f"{r['params'] / was['params']:.4f}"] if was else ["-", "-"]
            rows.append(row)
    if not rows:
        return "no cell of this run recorded its memory (the titan03 probe records it after step 1)\n"
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True) + "\n"
