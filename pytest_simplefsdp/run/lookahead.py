"""What a run would do, without doing it (--simplefsdp-dry-run, --simplefsdp-plan): every job in launch order with
its exact command, or the packed schedule with expected times. ``state``: the state.state.MatrixSession,
``selected``: its (run, cell) in collection order, ``progress``: their expected times (progress.Progress)."""

from __future__ import annotations

import os

from ..judge.numerics import lane_for, tolerance
from ..kinds import Device
from ..machine import cuda_device_ids
from ..spec.cells import first_id
from ..spec.matrix import matches
from ..words import plural
from .progress import duration
from .schedule import plan


def summary(state, selected, progress, tr, verbose=False):
    """Every job the run would launch, in the order it would: seed checkpoints, baselines, then the cells, one line
    each; with ``verbose`` (-v) each with its exact command (every rank's environment and argv; the cells' with the
    seed flags they will get) and what its evidence will check. Without, the first cell's command as an example."""
    if state.settings.plan is not None:
        return _plan(state, selected, progress, tr)
    seeds, baselines = {}, {}
    for run, cell in selected:
        job = state.book.seed_job(run, cell)
        if job:
            seeds.setdefault((run.name, job.model), (run, job))
        base = state.book.baseline_cell(run, cell)
        if base is not None and not any(r is run and c.axes == base.axes for r, c in selected):
            baselines.setdefault((run.name, base.id), (run, base, []))[2].append(cell.id)
    if seeds:
        tr.section("simplefsdp dry run: seed checkpoints (before the cells; kept for later runs by content key)")
        for run, job in seeds.values():
            spec = state.runner.seed_spec(run, job.model, job.command, job.folder, port=29500)
            kept = state.book.kept.kept(job.name, job.key)
            tr.write_line(
                f"{run.name}: {job.name}  [1 rank] -> {job.folder / 'checkpoint' / 'step-0'}"
                + ("  (kept from an earlier run: not run again)" if kept else "")
            )
            if verbose:
                tr.write_line(f"  {state.runner.launcher_for(run).reproducer(spec)}")
    if baselines:
        tr.section("simplefsdp dry run: numerics baselines (run once, before the first cell compared with them)")
        for run, base, users in baselines.values():
            job = state.book.seed_job(run, base)
            kept = state.book.kept.kept(base.id, state.book.baseline_key(run, base, job.folder if job else None))
            _job(
                state,
                tr,
                run,
                base,
                verbose,
                f"baseline of {plural(len(users), 'cell')}: {', '.join(users[:4])}"
                f"{' ...' if len(users) > 4 else ''}" + ("  (kept from an earlier run: not run again)" if kept else ""),
            )
    tr.section("simplefsdp dry run: " + ("commands" if verbose else "cells"))
    for run, cell in selected:
        _job(state, tr, run, cell, verbose)
    if not verbose and selected:
        run, cell = selected[0]
        tr.write_line(
            f"the command of {cell.id}, as each job's is made (every rank's, with what its evidence checks, under -v):"
        )
        _command(state, tr, run, cell)
    for run in state.runs:
        why = state.not_here.get(run.name)
        tr.write_line(
            f"{run.name}: {len(run.cells)} valid cells, {len(run.dropped)} n/a"
            + (f"; not on this machine: {why}" if why else "")
        )
    if seeds:
        tr.write_line(
            "seed checkpoints not kept yet, and the targets' assets the commands name, are made on the "
            "first real run (a dry run launches and writes nothing)"
        )


def _plan(state, selected, progress, tr):
    """--simplefsdp-plan: the selected cells packed as --simplefsdp-jobs=auto would pack them (GPU cells on
    the visible or the named number of GPUs, CPU cells within the ranks budget), each with its expected time."""
    want = state.settings.plan
    gpus = [str(i) for i in range(want)] if isinstance(want, int) else cuda_device_ids()
    budget = state.settings.max_ranks or os.cpu_count() or 1
    for device in (Device.CUDA, Device.CPU):
        items = [(r, c) for r, c in selected if r.matrix.device == device]
        if not items:
            continue
        cells = [(r.key(c.id), c.world, progress.expected[r.key(c.id)]) for r, c in items]
        on = f"{len(gpus)} GPUs" if device == Device.CUDA else f"a budget of {budget} CPU ranks"
        tr.section(f"simplefsdp plan: {len(cells)} {device} cells on {on}")
        rows = plan(cells, len(cells), budget, gpus if device == Device.CUDA else None)
        for key, world, start, end, devs in rows:
            where = f"GPUs {','.join(devs)}" if devs else f"{world} ranks"
            when = (
                "cannot run: more GPUs than planned for"
                if start is None
                else f"{duration(start):>8} -> {duration(end):>8}"
            )
            tr.write_line(f"{when}  {where:<16} {key}")
        serial = sum(s for _, _, s in cells)
        ends = [end for *_, end, _ in rows if end is not None]
        tr.write_line(
            f"expected: {duration(max(ends, default=0))} packed (--simplefsdp-jobs=auto), "
            f"{duration(serial)} one cell at a time (--simplefsdp-jobs=1)"
        )
    stored = sum(1 for k in progress.expected if k in progress.stored)
    tr.write_line(
        f"times: {stored} of {len(progress.expected)} cells from stored runs"
        + (f" (newest: {progress.source})" if progress.source else "")
        + "; the others estimated per cell size (CPU: the measured median under its launcher; GPU: 60 s)"
    )


def _job(state, tr, run, cell, verbose, note=""):
    spec = state.runner.spec_for(run, cell, port=29500, seed=_seed(state, run, cell))
    tr.write_line(
        f"{run.name}::{cell.id}  [{ranks(run, cell, spec.device)}, timeout {spec.timeout:.0f} s]"
        + (f"  {note}" if note else "")
    )
    for error in spec.command.lacking:  # (runner.not_launched: it fails as invalid_config without a launch)
        tr.write_line(f"  invalid_config, not launched: {error} ({error.flag.source})")
    if verbose:
        _command(state, tr, run, cell)


def ranks(run, cell, device) -> str:
    """How many ranks a cell's launch runs, and where a trace cell's one simulated rank runs."""
    if run.processes(cell) == cell.world:
        return plural(cell.world, "rank")
    return f"1 simulated rank of {cell.world}, on {'one GPU' if device == Device.CUDA else 'this CPU'}"


def _seed(state, run, cell):
    job = state.book.seed_job(run, cell)
    return job.folder if job else None


def _command(state, tr, run, cell):
    seed = _seed(state, run, cell)
    spec = state.runner.spec_for(run, cell, port=29500, seed=seed)
    for step in run.target.before_steps(cell):  # (e.g. precompile: one process, before the ranks)
        before = state.runner.step_spec(run, cell, step, seed=seed, port=29500)
        tr.write_line(f"  first, the {step} step [1 process]: {state.runner.launcher_for(run).reproducer(before)}")
    tr.write_line(f"  {state.runner.launcher_for(run).reproducer(spec)}")
    plan = run.target.evidence_lines(cell)
    if plan:
        tr.write_line(f"  evidence: {'; '.join(plan)}")
    said = numerics_line(state, run, cell)
    if said:
        tr.write_line(f"  numerics: {said}")


def numerics_line(state, run, cell) -> str | None:
    """The baseline a cell will be compared with, in which lane and with which tolerances (None: not compared)."""
    numerics = run.matrix.numerics
    if not numerics:
        return None
    lane = lane_for(numerics.lanes, cell.axes)
    if lane is None:
        skip = next((x for x in numerics.lanes if not x.compare and any(matches(m, cell.axes) for m in x.match)), None)
        return f"not compared (lane {skip.name}, {skip.where})" if skip else None
    base = state.book.baseline_cell(run, cell)
    if base is None:
        return "the baseline itself: the cells of its model and data-parallel degree compare with it"
    grad, update = tolerance("grad_norm", lane), tolerance("update_norm", lane)
    files = [n.path.name for n in numerics.noises if first_id(cell.id) in n.layouts]
    return (
        f"vs {base.id}, lane {lane.name} (loss rtol {lane.rtol:g}, "
        f"grad norms rtol {grad[0]:g} to step {grad[2]}, update norms rtol {update[0]:g}); "
        + (
            f"narrowed to this layout's noise where {' or '.join(files)} holds (the versions and machine it names)"
            if files
            else "the layout's noise unmeasured "
            + ("on a GPU" if run.matrix.device == Device.CUDA else "here")
            + (f" (no row in {numerics.noise.path.name})" if numerics.noise else " (no noise file)")
            + ": the lane's tolerances"
        )
    )
