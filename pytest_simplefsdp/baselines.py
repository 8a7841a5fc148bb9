"""Step 6, the numerics step's book: the seed checkpoint each model's cells start from, the baseline each
cell is compared with (run once per session, taken from a cell that already ran, or read from a stored
run), and the comparison itself (losses per step, then per-parameter gradient and parameter norms).

What cannot be had is an ``Unavailable`` with its reason, never a bare string."""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import report
from .cells import Cell, cell_id, value_id, world_size
from .evidence import probe_folder
from .kinds import FailureClass, Status
from .numerics import compare, compare_params, lane_for, mismatch_line, param_line, plot, read_param_stats
from .results import CellResult


@dataclass(frozen=True)
class Unavailable:
    """A seed checkpoint or baseline that could not be had, and why (the cell's numerics failure line)."""

    reason: str


def axes_key(axes):
    return tuple(sorted(axes.items()))


def load_stored(path):
    """(profile, axes key) -> record of every usable baseline or cell of a stored run (--simplefsdp-baseline)."""
    if not path:
        return {}
    try:
        doc = report.load_run(path)
    except (OSError, SystemExit) as e:
        raise pytest.UsageError(f"--simplefsdp-baseline: {path}: {e}") from None
    stored = {}
    for run in doc.get("runs", []):
        for rec in run.get("baselines", []) + run.get("cells", []):
            if rec.get("status") in ("passed", "xpassed") or rec.get("failure_class") is None:
                stored[(run["meta"].get("profile"), axes_key(rec["axes"]))] = rec
    return stored


class Book:
    def __init__(self, runner, store, run_dir: Path, stored_path=None):
        self.runner, self.store, self.run_dir = runner, store, run_dir
        self.stored = load_stored(stored_path)
        self.lock = threading.RLock()  # cells may run in threads; each seed and baseline is made once
        self.seeds = {}  # (run name, model) -> Path | Unavailable
        self.baselines = {}  # (run name, axes key) -> CellResult | Unavailable
        self.passed = {}  # (run name, axes key) -> CellResult of a cell of this process that passed

    def note(self, run, result):
        """A cell this process ran: a later cell whose baseline it is need not run it again."""
        if result.failure_class is None and not result.mutant:
            self.passed.setdefault((run.name, axes_key(result.axes)), result)

    def reused(self, run, cell) -> CellResult | None:
        """The cell's result when it already ran as another cell's baseline."""
        done = None if cell.mutant else self.baselines.get((run.name, axes_key(cell.axes)))
        if isinstance(done, CellResult):
            return dataclasses.replace(done, id=cell.id, details=[f"same cell as baseline {done.id}"])
        return None

    # --- seed checkpoints ---------------------------------------------------------------------------

    def seed_job(self, run, cell):
        """(model, folder, command) of the seed job the cell starts from; None where numerics need none."""
        if not run.matrix.numerics or "model" not in cell.axes:
            return None
        model = cell.axes["model"]
        folder = self.run_dir / value_id(run.matrix.profile) / f"seed-{model}"
        command = run.target.seed_command(model, folder)
        return None if command is None else (model, folder, command)

    def seed_for(self, run, cell) -> Path | Unavailable | None:
        """The seed checkpoint of the cell's model (made once per run); None where numerics need none."""
        job = self.seed_job(run, cell)
        if job is None:
            return None
        model, folder, command = job
        with self.lock:
            key = (run.name, model)
            if key not in self.seeds:
                failed = self.runner.run_seed(run, model, command, folder)
                self.seeds[key] = folder if failed is None else Unavailable(
                    f"seed checkpoint for {model} failed: {failed.error_line} (logs: {folder})")
            return self.seeds[key]

    # --- baselines ----------------------------------------------------------------------------------

    def baseline_for(self, run, cell, result) -> CellResult | Unavailable:
        base_axes = run.target.baseline_axes(cell.axes)
        key = (run.name, axes_key(base_axes))
        if base_axes == cell.axes and not cell.mutant:  # a mutated run is compared with the cell unmutated
            self.baselines[key] = result
            return result
        stored = self.stored.get((run.matrix.profile, axes_key(base_axes)))
        if stored is not None:
            return self._from_stored(run, stored)
        with self.lock:
            if key not in self.baselines:
                self.baselines[key] = self._run_baseline(run, base_axes, key)
            return self.baselines[key]

    @staticmethod
    def _from_stored(run, stored):
        losses = {int(k): (math.nan if v is None else v) for k, v in stored["losses"].items()}
        want = run.matrix.settings.get("steps")
        if want and len(losses) != want:
            return Unavailable(f"stored baseline {stored['id']} has {len(losses)} steps, this run trains {want}")
        return CellResult(stored["id"], stored["axes"], losses=losses, log_dir=stored.get("log_dir", ""))

    def baseline_cell(self, run, cell) -> Cell | None:
        """The baseline job a cell is compared with, where it is another cell and no stored run gives it."""
        if not run.matrix.numerics or lane_for(run.matrix.numerics.lanes, cell.axes) is None:
            return None
        base_axes = run.target.baseline_axes(cell.axes)
        if base_axes == cell.axes or (run.matrix.profile, axes_key(base_axes)) in self.stored:
            return None
        return self._base_cell(run, base_axes)

    @staticmethod
    def _base_cell(run, base_axes):
        return Cell("baseline-" + cell_id(run.matrix, base_axes), base_axes, world_size(run.matrix, base_axes))

    def _run_baseline(self, run, base_axes, key):
        done = self.passed.get(key)
        if done is None:
            cell = self._base_cell(run, base_axes)
            seed = self.seed_for(run, cell)
            if isinstance(seed, Unavailable):
                return Unavailable(f"baseline {cell.id} has no seed: {seed.reason}")
            done = self.runner.run(run, cell, seed=seed)
            done.details.append("numerics baseline")
            self.store.record(run, done, kind="baseline")
        if done.failure_class is None:
            return done
        return Unavailable(f"baseline {done.id} failed: [{done.failure_class}] {done.error_line} (logs: {done.log_dir})")

    # --- the comparison -----------------------------------------------------------------------------

    def check(self, run, cell, result):
        """Compare a green cell with its baseline in its numerics lane; a mismatch fails it as numerics."""
        lane = lane_for(run.matrix.numerics.lanes, cell.axes)
        if lane is None or result.status != Status.PASSED:
            return
        base = self.baseline_for(run, cell, result)
        if isinstance(base, Unavailable):
            return result.fail(FailureClass.NUMERICS, base.reason)
        ok, rep = compare(result.losses, base.losses, lane)
        rep["baseline"] = base.id
        result.numerics = rep
        line = None if ok else mismatch_line(rep, base.id)
        stats = read_param_stats(probe_folder(result.log_dir))
        if stats:  # the target's probe recorded per-parameter norms: the baseline's must be there too
            base_stats = read_param_stats(probe_folder(base.log_dir)) if base.log_dir else {}
            if not base_stats:
                rep["params"] = f"not compared: baseline {base.id} has no per-parameter records"
            else:
                params_ok, rep["params"] = compare_params(stats, base_stats, lane)
                first = rep["params"]["first_difference"]
                # the earlier of the two is the cause: a gradient off at step 1 moves the loss of step 2
                if not params_ok and (ok or first["step"] <= (rep["first_differing_step"] or math.inf)):
                    ok, line, rep["check"] = False, param_line(rep["params"], base.id), first["kind"]
        if not ok:
            rep.setdefault("check", "loss")
            result.fail(FailureClass.NUMERICS, line)
            result.plot = plot(Path(result.log_dir) / "curves_vs_baseline.png",
                               {"loss": result.losses, "grad_norm": result.grad_norms},
                               {"loss": base.losses, "grad_norm": base.grad_norms}, f"{cell.id} vs {base.id}")

