"""Plots of a run (matplotlib's Agg backend, where matplotlib is installed; else none): a numerics failure's
curves against its baseline, and the run's wall time per cell."""

from __future__ import annotations

from pathlib import Path

from .kinds import Status


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(path: Path, cell: dict, baseline: dict, title: str):
    """Loss and grad-norm curves of a cell against its baseline, each over a panel of the difference
    (cell - baseline): two curves that overlap at small differences still show where they part.
    ``cell`` / ``baseline``: {"loss": {step: value}, "grad_norm": {step: value}}. None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    kinds = [k for k in ("loss", "grad_norm") if cell.get(k) or baseline.get(k)]
    fig, axes = plt.subplots(
        2,
        len(kinds),
        figsize=(4.5 * len(kinds), 4.8),
        dpi=100,
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [2, 1]},
    )
    for col, kind in enumerate(kinds):
        top, bottom = axes[0][col], axes[1][col]
        for name, data, style in (("baseline", baseline.get(kind, {}), "o-"), ("cell", cell.get(kind, {}), "x--")):
            steps = sorted(data)
            top.plot(steps, [data[s] for s in steps], style, label=name)
        both = sorted(set(cell.get(kind, {})) & set(baseline.get(kind, {})))
        bottom.axhline(0, color="grey", linewidth=0.5)
        bottom.plot(both, [cell[kind][s] - baseline[kind][s] for s in both], "s-", color="tab:red")
        top.set_ylabel(kind.replace("_", " "))
        top.legend(fontsize=7)
        bottom.set_ylabel("cell - baseline", fontsize=7)
        bottom.set_xlabel("step")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def walltime_plot(path: Path, doc: dict):
    """The run at a glance: one bar per cell that ran, its wall time, coloured by outcome. None without
    matplotlib or cells."""
    plt = _pyplot()
    cells = [(run["meta"].get("profile"), rec) for run in doc["runs"] for rec in run["cells"] if rec.get("wall")]
    if plt is None or not cells:
        return None
    colours = {
        Status.PASSED: "tab:green",
        Status.FAILED: "tab:red",
        Status.XFAILED: "tab:orange",
        Status.XPASSED: "tab:purple",
    }
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.18 * len(cells)), dpi=100)
    ax.barh(
        range(len(cells)),
        [rec["wall"] for _, rec in cells],
        color=[colours.get(rec["status"], "tab:grey") for _, rec in cells],
    )
    ax.set_yticks(range(len(cells)), [f"{p}::{rec['id']}" for p, rec in cells], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    ax.set_title(
        f"{len(cells)} cells, {sum(rec['wall'] for _, rec in cells):.0f} s in all (green pass, red fail, "
        f"orange known failure)",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)
