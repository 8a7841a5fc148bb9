"""Step 5 (numerics): compare a cell's losses with its baseline's, step by step.

"Composes" means "trains the same": every cell of a model starts from the same seed checkpoint,
trains on the same global batch, and its per-step losses must follow the baseline cell (same
model, same data-parallel degree, SimpleFSDP eager) within its lane's tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path

from .matrix import Lane


def lane_for(lanes, axes):
    """The first lane one of whose partial cells matches the axes."""
    for lane in lanes:
        if any(all(axes.get(k) == v for k, v in m.items()) for m in lane.match):
            return lane
    return None


def compare(losses: dict, baseline: dict, lane: Lane):
    """Returns (ok, report). ``losses``/``baseline``: step -> loss. NaN or a missing step fails."""
    steps = sorted(baseline)
    rows, misses, first_bad = [], 0, None
    max_abs = max_rel = 0.0
    for step in steps:
        b, c = baseline[step], losses.get(step)
        if c is None or c != c or b != b or math.isinf(c):
            ok_step, diff, rel = False, math.nan, math.nan
        else:
            diff = abs(c - b)
            rel = diff / abs(b) if b else (0.0 if diff == 0 else math.inf)
            ok_step = diff <= lane.atol + lane.rtol * abs(b)
            max_abs, max_rel = max(max_abs, diff), max(max_rel, rel)
        if not ok_step:
            misses += 1
            first_bad = first_bad if first_bad is not None else step
        rows.append({"step": step, "baseline": b, "cell": c, "abs_diff": diff})
    extra = sorted(set(losses) - set(baseline))
    allowed = math.floor(lane.max_miss * len(steps))
    hard = any(r["cell"] is None or r["cell"] != r["cell"] for r in rows)
    ok = bool(steps) and misses <= allowed and not hard and not extra
    report = {"lane": lane.name, "rtol": lane.rtol, "atol": lane.atol, "max_miss": lane.max_miss,
              "max_abs_diff": max_abs, "max_rel_diff": max_rel, "missed_steps": misses,
              "first_differing_step": first_bad, "steps": [{**r, "abs_diff": _num(r["abs_diff"])} for r in rows]}
    if extra:
        report["extra_steps"] = extra
    return ok, report


def _num(x):
    return None if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else x


def mismatch_line(report, baseline_id):
    step = report["first_differing_step"]
    row = next((r for r in report["steps"] if r["step"] == step), None)
    if row is None:
        return f"losses do not line up with baseline {baseline_id}: {report.get('extra_steps')}"
    diff = "n/a" if row["abs_diff"] is None else f"{row['abs_diff']:.3g}"
    return (f"loss differs from baseline {baseline_id} at step {step}: cell {row['cell']} vs baseline "
            f"{row['baseline']} (|diff| {diff}; lane {report['lane']}: rtol {report['rtol']:g}, atol "
            f"{report['atol']:g}, {report['missed_steps']} step(s) off)")


def plot(path: Path, losses: dict, baseline: dict, title: str):
    """A loss-curve PNG (baseline vs cell); None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    for name, data, style in (("baseline", baseline, "o-"), ("cell", losses, "x--")):
        steps = sorted(data)
        ax.plot(steps, [data[s] for s in steps], style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def tensorboard_losses(dump_folder: Path, tag="loss_metrics/global_avg_loss"):
    """Full-precision losses from torchtitan's TensorBoard events (the log prints 5 decimals)."""
    files = sorted(Path(dump_folder).rglob("events.out.tfevents.*"))
    if not files:
        return {}
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return {}
    losses = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                losses[int(event.step)] = float(event.value)
    return losses
