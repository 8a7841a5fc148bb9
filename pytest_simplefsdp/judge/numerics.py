"""Step 6 (numerics): compare a cell's losses, gradient and parameter norms with its baseline's.

"Composes" means "trains the same": every cell of a model starts from the same seed checkpoint,
trains on the same global batch, and its per-step losses must follow the baseline cell (same
model, same data-parallel degree, SimpleFSDP eager) within its lane's tolerance. Losses alone miss
gradient bugs: AdamW's update barely changes when one parameter's gradient is scaled, so where the
target's probe records them, every parameter's gradient norm (before clipping), its norm after the
optimizer step, and a checksum of the weights it loaded are compared too, and the first parameter
that differs is named.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..spec.matrix import Lane, matches
from ..words import release


def lane_for(lanes, axes):
    """The first lane one of whose partial cells matches the axes (None: no lane, or one that compares nothing)."""
    for lane in lanes:
        if any(matches(m, axes) for m in lane.match):
            return lane if lane.compare else None
    return None


def compare(losses: dict, baseline: dict, lane: Lane):
    """Returns (ok, report). ``losses``/``baseline``: step -> loss. NaN or a missing step fails."""
    steps = sorted(baseline)
    rows, misses, first_bad, first_margin = [], 0, None, None
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
            if first_bad is None:
                first_bad, first_margin = step, margin(b, c, lane.rtol, lane.atol)
        rows.append({"step": step, "baseline": b, "cell": c, "abs_diff": diff})
    extra = sorted(set(losses) - set(baseline))
    allowed = math.floor(lane.max_miss * len(steps))
    hard = any(r["cell"] is None or r["cell"] != r["cell"] for r in rows)
    ok = bool(steps) and misses <= allowed and not hard and not extra
    report = {
        "lane": lane.name,
        "rtol": lane.rtol,
        "atol": lane.atol,
        "max_miss": lane.max_miss,
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
        "missed_steps": misses,
        "first_differing_step": first_bad,
        "margin": _num(first_margin),
        "steps": [{**r, "abs_diff": _num(r["abs_diff"])} for r in rows],
    }
    if extra:
        report["extra_steps"] = extra
    return ok, report


# the per-parameter records of the probes, in the order a bug shows within a step: the loaded weights, the
# gradients, the optimizer's update (judge.invariants.update_norms), the weights after it
PARAM_KINDS = {
    "init_checksum": "weight checksum",
    "grad_norm": "grad norm",
    "update_norm": "update norm",
    "param_norm": "param norm",
}


def tolerance(kind, lane: Lane):
    """(rtol, atol, last step judged) of a per-parameter kind in a lane: the weight checksum exactly (both loaded
    the same seed checkpoint); gradient and parameter norms with grad_rtol/grad_atol up to grad_steps; update
    norms with update_rtol/update_atol (default: the grad ones) up to update_steps (default: every step)."""
    grad = (
        lane.rtol if lane.grad_rtol is None else lane.grad_rtol,
        lane.atol if lane.grad_atol is None else lane.grad_atol,
    )
    if kind == "init_checksum":
        return 0.0, 0.0, 0
    if kind == "update_norm":
        return (
            grad[0] if lane.update_rtol is None else lane.update_rtol,
            grad[1] if lane.update_atol is None else lane.update_atol,
            math.inf if lane.update_steps is None else lane.update_steps,
        )
    return (*grad, lane.grad_steps)


# shim.provenance.numerics_machine: a CPU's, and a GPU rank's GPU, driver and CUDA
NUMERICS_FIELDS = ("aten", "mkl", "onednn", "threads", "model", "caches", "flags", "gpu", "driver", "cuda")


def numerics_key(machine: dict | None) -> dict | None:
    """What of a run's machine decides its CPU bits (shim.provenance.numerics_machine): the kernels' ISA, MKL's
    branch, oneDNN's cap, the threads, and the CPU (model, vector flags, caches), which MKL's AUTO branch and oneDNN
    follow. None: not known (nothing recorded, or ranks that disagree)."""
    if not machine or "ranks" in machine:
        return None
    return {
        k: (" ".join(v) if isinstance(v, list) else json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v))
        for k in NUMERICS_FIELDS
        if (v := machine.get(k)) is not None
    }


def noise_applies(noise, versions, machine) -> str | None:
    """Why the noise file does not hold for a run (another torch or torchtitan, another machine's numerics, or one it
    does not name), else None."""
    ran = {p: release(v) for p, v in (versions or {}).items()}
    pinned = {p: v for p, v in noise.measured_on.items() if p != "machine"}
    other = [f"{p} {ran.get(p) or '(none)'}" for p, v in pinned.items() if ran.get(p) != str(v)]
    if other:
        return f"measured on {', '.join(f'{p} {v}' for p, v in pinned.items())}; this run: {', '.join(other)}"
    theirs, mine = numerics_key(noise.measured_on.get("machine")), numerics_key(machine)
    if theirs is None and mine is None and not machine:  # a target whose ranks run no torch kernels: no machine
        return None
    if theirs is None:
        return f"{noise.path} does not name the machine it was measured on (measure it again: --format noise)"
    if mine is None:
        return "this run's ranks did not record their machine" + (" (they disagree)" if machine else "")
    if theirs != mine:
        keys = [k for k in NUMERICS_FIELDS if theirs.get(k) != mine.get(k)]
        differ = [f"{k} {mine.get(k)!r} (measured: {theirs.get(k)!r})" for k in keys]
        device = "GPU" if {"gpu", "driver", "cuda"} & set(keys) else "CPU"
        return f"this run's {device} numerics differ from the machine measured: {'; '.join(differ)}"
    return None


def narrowed(lane: Lane, noise, cell_id, versions, machine=None) -> Lane:
    """The lane as it judges one cell: where the profile's noise file measured this layout on the versions and the
    numerics machine (noise_applies) the cell runs, each relative tolerance (loss, gradient norms, update norms) is
    ``margin`` times the layout's own noise, at least ``floor``, at most the lane's: a quiet layout gets no headroom
    sized for the noisiest of its lane. Elsewhere the lane's own tolerances hold."""
    row = noise.layouts.get(cell_id) if noise is not None else None
    if row is None or noise_applies(noise, versions, machine):
        return lane

    def tight(kind, lane_rtol):
        return min(lane_rtol, max(noise.margin * row.get(kind, math.inf), noise.floor))

    wide = (lane.rtol, tolerance("grad_norm", lane)[0], tolerance("update_norm", lane)[0])
    own = tuple(tight(kind, rtol) for kind, rtol in zip(("loss", "grad_norm", "update_norm"), wide))
    if own == wide:  # (an exact lane: nothing tighter than 0)
        return lane
    return replace(
        lane, name=f"{lane.name}, layout noise x{noise.margin:g}", rtol=own[0], grad_rtol=own[1], update_rtol=own[2]
    )


def read_param_stats(folder: Path) -> dict:
    """kind -> step -> FQN -> value (None: no gradient), merged over the ranks' grads.rank<N>.jsonl.
    Ranks that hold the same parameter record the same full-tensor value; the first one is kept."""
    out: dict = {}
    for path in sorted(Path(folder).glob("grads.rank*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                per_step = out.setdefault(rec["kind"], {}).setdefault(int(rec["step"]), {})
            except (ValueError, KeyError, TypeError):
                continue  # a rank killed mid-write leaves half a line
            for fqn, value in rec.get("values", {}).items():
                per_step.setdefault(fqn, value)
    return out


def compare_params(cell: dict, baseline: dict, lane: Lane):
    """Returns (ok, report): every parameter of the baseline's records, each kind within its tolerance up to its
    last judged step (``tolerance``). Step 1 is where both runs hold the same weights and batch, so only the
    reductions' order separates them; from step 2 the optimizer carries that rounding on and MoE routing amplifies
    it in the gradients (measured on deepseek_v3 EP 2: 2e-5 at step 1, 3e-2 for a router gate at step 3), so other
    layouts judge gradients at step 1 only, and every step by the optimizer's update norms, which AdamW keeps
    close. The report keeps the largest relative difference per kind and step (how tolerances are measured), how
    many weights' checksums differ, and the first difference."""
    rtol, atol, _ = tolerance("grad_norm", lane)
    report = {
        "rtol": rtol,
        "atol": atol,
        "grad_steps": lane.grad_steps,
        "checked": 0,
        "max_rel_diff": {},
        "first_difference": None,
    }
    if "update_norm" in baseline:
        report["update_rtol"], report["update_atol"], _ = tolerance("update_norm", lane)
    steps = sorted({s for kind in PARAM_KINDS for s in baseline.get(kind, {})})
    for step in steps:
        for kind in PARAM_KINDS:
            want, got = baseline.get(kind, {}).get(step), cell.get(kind, {}).get(step) or {}
            if want is None:
                continue
            krtol, katol, last = tolerance(kind, lane)
            exact, compared = kind == "init_checksum", step <= last
            # the lane's absolute floor is the largest value's of this kind and step; every other parameter's
            # floor shrinks with its own value, so a router's gradient of 3e-4 is judged as strictly, relative to
            # itself, as the embedding's of 1 (a floor of 2e-5 once let it move 1.3e-3, 60x its noise)
            scale = max((abs(v) for v in want.values() if isinstance(v, (int, float)) and v == v), default=0.0)
            for fqn in list(want) + [f for f in got if f not in want]:
                b, c = want.get(fqn), got.get(fqn)
                if exact:  # a hash: equal or not (a relative difference of two hashes means nothing)
                    report["weights_differing"] = report.get("weights_differing", 0) + (b != c)
                elif b and c is not None and c == c:  # measured at every step, judged up to grad_steps
                    worst = report["max_rel_diff"].setdefault(kind, {})
                    worst[str(step)] = max(worst.get(str(step), 0.0), abs(c - b) / abs(b))
                if not compared:
                    continue
                report["checked"] += 1
                floor = param_floor(b, katol, scale)
                if _param_differs(b, c, krtol, floor) and report["first_difference"] is None:
                    report["first_difference"] = {
                        "kind": kind,
                        "step": step,
                        "param": fqn,
                        "cell": c,
                        "baseline": b,
                        "rtol": krtol,
                        "atol": katol,
                        "floor": floor,
                        "margin": _num(margin(b, c, krtol, floor)),
                    }
    ok = report["checked"] > 0 and report["first_difference"] is None
    return ok, report


def param_floor(b, atol, scale) -> float:
    """One parameter's absolute floor: the lane's ``atol`` scaled by its value against the largest of its kind at
    that step (``scale``), never larger than ``atol`` and never larger, relative to the value, for a small value
    than for the largest one."""
    if not atol or not scale or not isinstance(b, (int, float)) or b != b:
        return 0.0
    return atol * min(1.0, abs(b) / scale)


def margin(b, c, rtol, atol) -> float | None:
    """How far past its tolerance a difference is (|c - b| / (atol + rtol |b|)): 2.0 is twice what was allowed;
    inf where nothing was (an exact lane), None where one side has no value."""
    if not isinstance(b, (int, float)) or not isinstance(c, (int, float)) or c != c or b != b:
        return None
    allowed = atol + rtol * abs(b)
    diff = abs(c - b)
    return diff / allowed if allowed else (math.inf if diff else 0.0)


def _param_differs(b, c, rtol, atol):
    if b is None or c is None:
        return (b is None) != (c is None)  # a gradient on one side only
    if c != c or math.isinf(c) or b != b:
        return True
    return abs(c - b) > atol + rtol * abs(b)


def param_line(report, baseline_id):
    d = report["first_difference"]
    what, value = PARAM_KINDS[d["kind"]], lambda v: "none" if v is None else f"{v:.6g}"
    ratio = f", ratio {d['cell'] / d['baseline']:.3g}" if d["cell"] is not None and d["baseline"] else ""
    tol = f"rtol {d.get('rtol', report['rtol']):g}, atol {d.get('floor', d.get('atol', report['atol'])):.3g}"
    if d.get("floor") is not None and d.get("atol") and d["floor"] < d["atol"]:
        tol += f" (the lane's {d['atol']:g} scaled to this value)"
    if d.get("margin") is not None and d["margin"] > 0:
        tol += f"; {d['margin']:.3g}x its tolerance"
    if d["kind"] == "init_checksum":  # a hash of the weights' bits: shown whole, no ratio
        value, ratio, tol = lambda v: "none" if v is None else f"{v:.0f}", "", "exact: the loaded weights differ"
    return (
        f"{d['param']}: {what} {value(d['cell'])} vs {value(d['baseline'])} of baseline {baseline_id} "
        f"at step {d['step']}{ratio} ({tol})"
    )


def _num(x):
    return None if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else x


def mismatch_line(report, baseline_id):
    step = report["first_differing_step"]
    row = next((r for r in report["steps"] if r["step"] == step), None)
    if row is None:
        return f"losses do not line up with baseline {baseline_id}: {report.get('extra_steps')}"
    diff = "n/a" if row["abs_diff"] is None else f"{row['abs_diff']:.3g}"
    return (
        f"loss differs from baseline {baseline_id} at step {step}: cell {row['cell']} vs baseline "
        f"{row['baseline']} (|diff| {diff}; lane {report['lane']}: rtol {report['rtol']:g}, atol "
        f"{report['atol']:g}, {report['missed_steps']} step(s) off)"
    )


def untrained_step(result):
    """The first step of a green run that trained nothing sound, as a failure line, or None: a loss that is
    nan or inf, or a grad norm of 0 or not finite (every PP cell once ran without backward and passed)."""
    bad = [k for k, v in result.losses.items() if math.isnan(v) or math.isinf(v)]
    if bad:
        return f"loss is {result.losses[min(bad)]} at step {min(bad)}"
    dead = sorted(k for k, v in result.grad_norms.items() if v == 0 or not math.isfinite(v))
    if dead:
        norm = result.grad_norms[dead[0]]
        return f"grad_norm is {norm} at step {dead[0]}" + (": that step trained nothing" if norm == 0 else "")
    return None
