"""Step 6, the numerics step's book: the seed checkpoint each model's cells start from, the baseline each
cell is compared with (run once per session, taken from a cell that already ran, or read from a stored
run), and the comparison itself (losses per step, then per-parameter gradient and parameter norms). Seed
checkpoints and baseline jobs are kept across runs by content key (reuse.py).

What cannot be had is an ``Unavailable`` with its reason, never a bare string."""

from __future__ import annotations

import dataclasses
import math
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..judge.invariants import stats_of as update_stats
from ..judge.numerics import (
    compare,
    compare_params,
    lane_for,
    mismatch_line,
    narrowed,
    noise_applies,
    param_line,
    read_param_stats,
)
from ..judge.results import CellResult
from ..kinds import FailureClass, RecordType, Status
from ..paths import probe_folder
from ..plots import plot
from ..spec.cells import Cell, cell_id, first_id, value_id, world_size
from ..store.reuse import ReuseStore, content_key
from ..store.runs import RunError, load_run
from ..versions.sets import cell_set


@dataclass(frozen=True)
class SeedJob:
    """The one-rank job that writes a model's seed checkpoint, into its kept folder (reuse.py)."""

    model: str
    name: str  # seed-<model>
    key: str  # content key of its command
    folder: Path  # .simplefsdp/reuse/<name>-<key>; the checkpoint is folder/checkpoint/step-0
    command: object  # targets.RankCommand
    vset: object = None  # versions.sets.VersionSet it runs on


@dataclass(frozen=True)
class Unavailable:
    """A seed checkpoint or baseline that could not be had, and why: the line of the cells that needed it, which
    fail as infra with the job named as the culprit (it, not the cell, is run again to confirm)."""

    reason: str
    culprit: str = ""  # "baseline <id>" or "seed checkpoint of <model>": the job that failed, where one ran


def param_stats(log_dir) -> dict:
    """Every per-parameter record of a run: the gradient probe's norms and checksums, and the update norms of its
    optimizer steps (judge.invariants)."""
    return {**read_param_stats(probe_folder(log_dir)), **update_stats(log_dir)}


def axes_key(axes):
    return tuple(sorted(axes.items()))


def load_stored(path):
    """(profile, axes key) -> record of every usable baseline or cell of a stored run (--simplefsdp-baseline)."""
    if not path:
        return {}
    try:
        doc = load_run(path)
    except (OSError, RunError) as e:
        raise pytest.UsageError(f"--simplefsdp-baseline: {path}: {e}") from None
    stored = {}
    for run in doc.get("runs", []):
        for rec in run.get("baselines", []) + run.get("cells", []):
            if rec.get("status") in (Status.PASSED, Status.XPASSED) or rec.get("failure_class") is None:
                stored[(run["meta"].get("profile"), axes_key(rec["axes"]))] = rec
    return stored


class Book:
    def __init__(self, runner, store, run_dir: Path, cache_dir: Path, stored_path=None, fresh=False, reuse_dir=None):
        self.runner, self.store, self.run_dir = runner, store, run_dir
        self.stored = load_stored(stored_path)
        self.cache_dir = Path(cache_dir)  # .simplefsdp: the plugin's own files (keyed by what made them)
        # seeds and baseline jobs of earlier runs (--simplefsdp-reuse-dir: shared with other rootdirs)
        self.kept = ReuseStore(Path(reuse_dir).absolute() if reuse_dir else self.cache_dir / "reuse", fresh)
        # the folders a job's key writes as placeholders: files there are named by their own keys
        self.roots = {"@reuse": self.kept.root, "@cache": self.cache_dir}
        self.lock = threading.RLock()  # cells may run in threads; each seed and baseline is made once
        self.seeds = {}  # (run name, model) -> Path | Unavailable
        self.seed_jobs = {}  # (run name, model) -> SeedJob | None: its key hashes files, so once per model
        self.seed_records = {}  # run name -> [{model, folder, kept}] of the seeds this process used
        self.baselines = {}  # (run name, axes key) -> CellResult | Unavailable
        self.passed = {}  # (run name, axes key) -> CellResult of a cell of this process that passed

    def note(self, run, result):
        """A cell this process ran: a later cell whose baseline it is need not run it again."""
        if result.failure_class is None and not result.mutant:
            self.passed.setdefault((run.name, axes_key(result.axes)), result)

    def reused(self, run, cell) -> CellResult | None:
        """The cell's result when it already ran as another cell's baseline."""
        done = None if cell.mutant else self.baselines.get((run.name, axes_key(cell.axes)))
        if isinstance(done, CellResult) and not done.reused_from:  # a cell of the matrix runs in every run
            return dataclasses.replace(done, id=cell.id, details=[f"same cell as baseline {done.id}"])
        return None

    # --- seed checkpoints ---------------------------------------------------------------------------

    def seed_job(self, run, cell) -> SeedJob | None:
        """The seed job the cell starts from; None where numerics need none."""
        if not run.matrix.numerics or "model" not in cell.axes:
            return None
        model, vset = cell.axes["model"], cell_set(cell.axes)
        if (run.name, model, vset) not in self.seed_jobs:  # (a version set makes its own seed, in its environment)
            command = run.target.seed_command(model, Path("@seed"))
            job = None
            if command is not None:
                name = f"seed-{model}" + ("" if vset.installed else f"-{vset.slug()}")
                key = content_key(self.runner.sets.apply(run, command, vset), self.roots)
                folder = self.kept.folder(name, key)
                job = SeedJob(
                    model,
                    name,
                    key,
                    folder,
                    self.runner.sets.apply(run, run.target.seed_command(model, folder), vset),
                    vset,
                )
            self.seed_jobs[(run.name, model, vset)] = job
        return self.seed_jobs[(run.name, model, vset)]

    def seed_for(self, run, cell) -> Path | Unavailable | None:
        """The seed checkpoint of the cell's model: kept from an earlier run, else made once per run (and kept)."""
        job = self.seed_job(run, cell)
        if job is None:
            return None
        with self.lock:
            key = (run.name, job.model, job.vset)
            if key not in self.seeds:
                self.seeds[key] = self._make_seed(run, job)
            return self.seeds[key]

    def _make_seed(self, run, job):
        kept = self.kept.kept(job.name, job.key) is not None
        if not kept:
            scratch = self.kept.scratch(job.name)
            self.runner.sets.problem(run, job.vset)  # its environment first: the command is spelled by its torchtitan
            command = self.runner.sets.apply(
                run, run.target.seed_command(job.model, scratch, job.vset.label()), job.vset
            )
            failed = self.runner.run_seed(run, job.model, command, scratch, job.vset)
            if failed is not None:
                return self._failed_seed(run, job, scratch, failed)
            self.kept.keep(scratch, job.name, job.key, {"model": job.model, "profile": run.matrix.profile})
        self.seed_records.setdefault(run.name, []).append(
            {"model": job.model, "folder": str(job.folder), "kept_from_earlier_run": kept}
        )
        return job.folder

    def _failed_seed(self, run, job, scratch, failed):
        logs = self.run_dir / value_id(run.matrix.profile) / job.name  # a failed seed's logs: in the run
        logs.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(logs, ignore_errors=True)
        scratch.rename(logs)
        return Unavailable(
            f"seed checkpoint for {job.model} failed: {failed.error_line} (logs: {logs})",
            f"seed checkpoint of {job.model}",
        )

    def retry(self, run, cell, attempt) -> Unavailable | None:
        """The job that failed a cell (its seed checkpoint, else its baseline) made again, as ``attempt``: None once
        it is had (the cell can be compared now), else why not. What this run had is forgotten first."""
        job = self.seed_job(run, cell)
        with self.lock:
            if job is not None and isinstance(self.seeds.get((run.name, job.model, job.vset)), Unavailable):
                self.seeds.pop((run.name, job.model, job.vset))
                seed = self.seed_for(run, cell)
                if isinstance(seed, Unavailable):
                    return seed
            base_axes = run.target.baseline_axes(cell.axes)
            key = (run.name, axes_key(base_axes))
            if isinstance(self.baselines.get(key), Unavailable):
                self.baselines[key] = self._run_baseline(run, base_axes, key, attempt)
            found = self.baselines.get(key)
            return found if isinstance(found, Unavailable) else None

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
        # what a target adds beyond the matrix's axes (titan03: a PP cell's microbatch size) is in the id too
        extra = "".join(f"-{k}{value_id(v)}" for k, v in base_axes.items() if k not in run.matrix.axes)
        return Cell("baseline-" + cell_id(run.matrix, base_axes) + extra, base_axes, world_size(run.matrix, base_axes))

    def baseline_key(self, run, cell, seed):
        """The content key of a baseline job (its command with placeholder folders; the seed's folder names
        the seed's own key)."""
        return content_key(self.runner.command(run, cell, Path("@cell") / "dump", 0, seed), self.roots)

    def _run_baseline(self, run, base_axes, key, attempt=""):
        done = self.passed.get(key)
        if done is None:
            cell = self._base_cell(run, base_axes)
            if attempt:  # run again to confirm a failure: beside the first run's folder
                cell = cell.attempt(attempt)
            seed = self.seed_for(run, cell)
            if isinstance(seed, Unavailable):
                return Unavailable(f"baseline {cell.id} has no seed: {seed.reason}", seed.culprit)
            digest = self.baseline_key(run, cell, seed)
            kept = None if attempt else self.kept.kept(cell.id, digest)
            if kept is not None:
                done = CellResult.from_record(self.kept.about(kept)["record"])
                # the axes it stands for in this run (the run that kept it may have had no `versions` axis)
                done.id, done.axes, done.log_dir, done.reused_from = cell.id, dict(base_axes), str(kept), str(kept)
                done.details = [
                    "numerics baseline",
                    f"kept from an earlier run ({kept}; --simplefsdp-fresh runs it again)",
                ]
            else:
                done = self.runner.run(run, cell, seed=seed)
                done.details.append("numerics baseline")
                if done.failure_class is None and not attempt:
                    self._keep_baseline(run, cell, done, digest)
            self.store.record(run, done, kind=RecordType.BASELINE)
        if done.failure_class is None:
            return done
        return Unavailable(
            f"baseline {done.id} failed: [{done.failure_class}] {done.error_line} (logs: {done.log_dir})",
            f"baseline {done.id}",
        )

    def _keep_baseline(self, run, cell, done, digest):
        """A copy of what a comparison reads (the record and the per-parameter probe records); the run keeps
        its logs."""
        scratch = self.kept.scratch(cell.id)
        if probe_folder(done.log_dir).is_dir():
            shutil.copytree(probe_folder(done.log_dir), probe_folder(scratch))
        self.kept.keep(scratch, cell.id, digest, {"profile": run.matrix.profile, "record": run.record_of(done)})

    # --- the comparison -----------------------------------------------------------------------------

    @staticmethod
    def lane_of(run, cell, result):
        """The cell's numerics lane as it judges this run: narrowed to the layout's own noise where the noise file
        holds for the run's versions and machine (a confirming rerun, `<cell>/confirm2`, is judged as its cell)."""
        lane = lane_for(run.matrix.numerics.lanes, cell.axes) if run.matrix.numerics else None
        if lane is None:
            return None
        return narrowed(
            lane, noise_for(run.matrix.numerics, result), first_id(cell.id), result.versions, result.machine
        )

    def check(self, run, cell, result):
        """Compare a green cell with its baseline in its numerics lane; a mismatch fails it as numerics."""
        lane = self.lane_of(run, cell, result)
        if lane is None or result.status != Status.PASSED:
            return
        noise = noise_for(run.matrix.numerics, result)
        base = self.baseline_for(run, cell, result)
        if isinstance(base, Unavailable):  # not the cell's failure: infra, naming the job that failed
            result.fail(FailureClass.INFRA, base.reason)
            result.culprit = base.culprit or "baseline"
            return
        ok, rep = compare(result.losses, base.losses, lane)
        rep["baseline"] = base.id
        said = noise_note(noise, first_id(cell.id), result)
        if said:  # its lane's tolerances judged it, not its layout's measured noise: the record says why
            rep["noise"] = said
        result.numerics = rep
        line = None if ok else mismatch_line(rep, base.id)
        stats = param_stats(result.log_dir)
        if stats:  # the target's probe recorded per-parameter norms: the baseline's must be there too
            base_stats = param_stats(base.log_dir) if base.log_dir else {}
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
            result.plot = plot(
                Path(result.log_dir) / "curves_vs_baseline.png",
                {"loss": result.losses, "grad_norm": result.grad_norms},
                {"loss": base.losses, "grad_norm": base.grad_norms},
                f"{cell.id} vs {base.id}",
            )


def numerics_too(book, run, cell, result) -> None:
    """The mutation tier asks every check: a mutated run an earlier check failed (its label not shown, an invariant
    broken) is compared with its baseline all the same, and ``also_killed_by`` says whether numerics see it too."""
    if result.failure_class not in (FailureClass.INVALID_CONFIG, FailureClass.NUMERICS) or result.numerics:
        return
    shadow = dataclasses.replace(result, status=Status.PASSED, failure_class=None, error_line=None, error_text=None)
    shadow.losses = run.target.losses(Path(result.log_dir) / "dump") or result.losses
    book.check(run, cell, shadow)
    result.numerics, result.plot = shadow.numerics, shadow.plot
    if shadow.failure_class == FailureClass.NUMERICS:
        result.also_killed_by = f"numerics ({shadow.numerics.get('check', 'loss')}): {shadow.error_line}"


def noise_note(noise, layout, result) -> str | None:
    """Why a cell's lane, not its layout's measured noise, judged it (None: the noise narrowed it): the layout's noise
    measured elsewhere ("not applied: ..."), or never measured on this machine ("unmeasured ...": no noise file, or
    none with the layout), which on a GPU names the GPU."""
    if noise is not None and layout in noise.layouts:
        held = noise_applies(noise, result.versions, result.machine)
        return f"not applied: {held}" if held else None
    machine = result.machine or {}
    where = "this machine"
    if machine.get("gpu"):
        where = f"this GPU ({machine['gpu']}, driver {machine.get('driver')}, CUDA {machine.get('cuda')})"
    named = f"{noise.path.parent.name}/{noise.path.name}" if noise is not None else ""
    missing = f"{named} has no row for {layout}" if named else "the profile names no noise file"
    return f"unmeasured on {where}: {missing}; its lane's tolerances judged it"


def noise_for(numerics, result):
    """The noise file that holds where the result ran (its versions and machine), else the section's first (whose
    reason for not holding the report says)."""
    return next((n for n in numerics.noises if not noise_applies(n, result.versions, result.machine)), numerics.noise)
