"""Steps 3-4 for one cell: its launch spec (in its version set's environment: sets.py), its launch (once more on
another port when the first lost its port to another process), its result, and the checks a green must pass
before it counts (checks.py). Numerics against a baseline are the next step (baselines.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from ..judge import provenance
from ..judge.results import CellResult, build_result, read_text
from ..kinds import FailureClass, Status, Tier
from ..launch.builtin import LAUNCHERS
from ..launch.procs import free_port
from ..launch.spec import LaunchOutcome, LaunchSpec
from ..machine import installed_commit, source_checkout
from ..paths import probe_folder
from ..spec import footprint
from ..spec.cells import Cell, first_id, value_id
from ..store import footprints
from ..versions.git import GitError, find_commit
from ..versions.sets import cell_set
from . import checks
from .sets import VersionSets

DEFAULT_TIMEOUT = 900.0


def render_trace(trace_dir: Path, out: Path):
    """tlparse's multi-rank HTML of a TORCH_TRACE folder, where tlparse is installed."""
    exe = shutil.which("tlparse") or shutil.which("tlparse", path=str(Path(sys.executable).parent))
    if not exe or not any(trace_dir.iterdir()):
        return None
    try:
        subprocess.run(
            [exe, str(trace_dir), "--all-ranks-html", "-o", str(out), "--overwrite", "--no-browser"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    index = out / "index.html"
    return str(index) if index.exists() else None


class CellRunner:
    def __init__(self, settings, launcher, run_dir: Path, max_ranks: int, envs=None, footprints=None):
        self.settings, self.launcher, self.run_dir, self.max_ranks = settings, launcher, run_dir, max_ranks
        self.footprints = footprints  # --simplefsdp-footprint: the store's folder (None: no footprint is made)
        self.checkout = settings.torchtitan_repo or source_checkout("torchtitan")
        self.sets = VersionSets(envs)  # where a cell's version set runs
        self.lock = threading.Lock()  # a target's assets are made once, whichever cell comes first

    def cell_timeout(self, run):
        return self.settings.timeout or run.matrix.timeout or DEFAULT_TIMEOUT

    def launcher_for(self, run):
        """The trace tier runs one plain process (torchrun would reset RANK); otherwise the chosen one (``auto``:
        the one it picks for the profile's device)."""
        if run.matrix.tier == Tier.TRACE:
            return LAUNCHERS["local"]()
        resolve = getattr(self.launcher, "resolve", None)
        return resolve(run.matrix.device) if resolve else self.launcher

    def launcher_name(self, run, cell):
        """The launcher that will really run the cell (the fork launcher runs what it cannot fork under local)."""
        launcher = self.launcher_for(run)
        runs_as = getattr(launcher, "runs_as", None)
        if runs_as is None:
            return launcher.name
        return runs_as(self.command(run, cell, Path("dump"), port=0))

    def command(self, run, cell, dump_folder, port, seed=None, later=0):
        """The target's command for the cell, as it runs in the cell's version set's environment."""
        command = run.target.command(
            cell, dump_folder=dump_folder, nproc=cell.world, port=port, seed_folder=seed, run=later
        )
        return self.sets.apply(run, command, cell_set(cell.axes))

    def cell_dir(self, run, name):
        tier = "" if run.matrix.tier == Tier.REAL else f"-{run.matrix.tier}"
        return self.run_dir / value_id(run.matrix.profile + tier) / name

    def spec_for(self, run, cell, port=None, seed=None, later=0) -> LaunchSpec:
        """The cell's launch; ``later``: its run number after the first (same dump folder, logs in run<N>/)."""
        cell_dir = self.cell_dir(run, cell.id)
        log_dir = cell_dir / f"run{later + 1}" if later else cell_dir
        port = port or free_port()
        command = self.command(run, cell, cell_dir / "dump", port, seed, later)
        command.env["SIMPLEFSDP_EVIDENCE_DIR"] = str(probe_folder(log_dir))  # where ranks record what ran
        self.ask_footprint(command)
        if cell.mutant:
            command.env["SIMPLEFSDP_MUTANT"] = cell.mutant
        # the trace tier: one process plays rank `trace.rank` of the cell's world
        nproc, first = (1, run.matrix.trace["rank"]) if run.matrix.tier == Tier.TRACE else (cell.world, 0)
        return LaunchSpec(
            cell.id,
            command,
            nproc,
            log_dir,
            self.cell_timeout(run),
            port,
            self.settings.log_limit_bytes,
            first_rank=first,
            device=run.matrix.device,  # (the trace tier's: this CPU, or one GPU where with_tier put it)
        )

    def prepare(self, run):
        with self.lock:
            if not run.prepared:
                run.target.prepare()
                run.prepared = True

    def run(self, run, cell, devices=None, seed=None) -> CellResult:
        """Launch the cell and read its result; a green also shows its evidence (else it fails)."""
        vset = cell_set(cell.axes)
        problem = self.sets.problem(run, vset)
        if problem:  # the set's environment cannot be built: its cells say why, the other sets run on
            return CellResult.infra(cell, problem, not_run=True)
        self.prepare(run)
        spec = self.spec_for(run, cell, seed=seed)
        if spec.command.lacking:  # the torchtitan it runs on has no such option: its parser would refuse the cell
            result = not_launched(cell, spec)
            result.versions = self.sets.ran_on(run, vset)
            return result
        if devices is not None:
            spec.command.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        launcher = self.launcher_for(run)
        failed, steps = self._before(run, cell, seed, launcher, devices)
        if failed is not None:
            return failed
        result = self._launch(run, cell, spec, launcher)
        result.details.extend(steps)
        if not vset.installed:  # asked for by name: it runs, and says where it leaves the target's range
            result.outside_range = run.target.outside_range(result.versions)
            result.details.extend(result.outside_range)
        if result.failure_class == FailureClass.INFRA and "is already in use" in (result.error_line or ""):
            # another process took the free port between our check and the bind: once more, elsewhere
            taken = result.error_line
            shutil.rmtree(spec.log_dir)
            spec.port = free_port()
            result = self._launch(run, cell, spec, launcher)
            result.details.append(f"first try: {taken}; relaunched on port {spec.port}")
        result.versions = self.sets.ran_on(run, vset)
        self.keep_footprint(run, cell, vset, spec, result)
        self.prove(run, vset, spec, result)
        checks.run_checks(run, cell, spec, result)
        if result.status == Status.PASSED and run.target.runs(cell) > 1:
            self._later_runs(run, cell, result, devices, seed, launcher)
        if run.matrix.numerics and result.status == Status.PASSED:
            result.losses = run.target.losses(spec.log_dir / "dump") or result.losses
        trace = Path(spec.command.env.get("TORCH_TRACE", spec.log_dir / "torch_trace"))
        if result.failure_class and trace.is_dir():
            result.trace_html = render_trace(trace, spec.log_dir / "tlparse")
        return result

    def ask_footprint(self, command):
        """--simplefsdp-footprint: the ranks record what of the checkout they ran (shim/footprint.py)."""
        if self.footprints is not None:
            command.env["SIMPLEFSDP_FOOTPRINT"] = str(self.checkout or 1)

    def keep_footprint(self, run, cell, vset, spec, result):
        """--simplefsdp-footprint: what the cell's ranks ran (its steps before it included), kept for the torchtitan
        commit they ran; none where a rank left no record (it died first) or the commit is not known."""
        if self.footprints is None or cell.mutant or run.matrix.tier != Tier.REAL:
            return
        pinned = dict(vset.pins).get("torchtitan", "")  # "@<sha>", a release, or none (the installed one)
        if pinned and not pinned.startswith("@"):
            commit = f"torchtitan-{pinned}"
        else:
            commit = pinned[1:] if pinned else (installed_commit() or ("",))[0]
        if self.checkout and commit and not commit.startswith("torchtitan-"):
            try:
                commit = find_commit(self.checkout, commit)
            except GitError:
                pass
        elif not commit and result.versions.get("torchtitan"):  # a release: its version names its code
            commit = f"torchtitan-{result.versions['torchtitan']}"
        folders = [(probe_folder(spec.log_dir), spec.nproc)] + [
            (probe_folder(self.cell_dir(run, cell.id) / step), 1) for step in run.target.before_steps(cell)
        ]
        named = self.named_paths(spec.command)
        prints = [footprint.of_ranks(folder, n, named) for folder, n in folders]
        if not commit or None in prints:
            result.details.append(
                "no footprint kept: "
                + ("the torchtitan commit it ran is not known" if not commit else "a rank left no footprint record")
            )
            return
        footprints.save(
            self.footprints,
            commit,
            value_id(run.matrix.profile),
            first_id(cell.id),
            footprint.union(prints),
            result.versions,
        )

    def named_paths(self, command) -> list[str]:
        """The checkout's files and folders the command names (the tokenizer, the dataset): read by code the trace
        cannot see (a tokenizer's Rust), they are in the footprint."""
        if not self.checkout:
            return []
        root = str(Path(self.checkout).resolve()) + "/"
        words = [w for a in [*command.argv, *command.env.values()] for w in re.split(r"[=,:\s]", str(a))]
        return sorted({w[len(root) :].rstrip("/") for w in words if w.startswith(root) and len(w) > len(root)})

    def prove(self, run, vset, spec, result):
        """What the ranks imported, against what the cell was to run on: a version set's run that ran other code is
        infra naming both (its own outcome is no verdict on the set), as is a passing one that cannot show what it
        imported; the installed side says where its ranks' imports are not the installed distribution."""
        found = provenance.read(spec.log_dir)
        records = found.get("imported", {})
        result.imported, result.machine = provenance.summary(records), provenance.agreed(found.get("machine", {}), {})
        expected = self.sets.expected(run, vset)
        wrong = provenance.mismatch(records, expected)
        if wrong is None and result.status == Status.PASSED and not vset.installed:
            unproved = [p for p in dict(vset.pins) if p not in result.imported]
            if unproved:
                wrong = (
                    f"the ranks did not show that they ran version set {vset.label()}: none recorded importing "
                    f"{', '.join(unproved)} (SIMPLEFSDP_PROVES, the start-up shim's record)"
                )
        if wrong:
            if result.status != Status.PASSED:
                result.details.append(f"its own outcome, not a verdict on {vset.label()}: {result.error_line}")
            result.fail(FailureClass.INFRA, wrong)
            result.not_run = True
        elif vset.installed:
            result.details.extend(provenance.differences(records, expected))

    def _launch(self, run, cell, spec, launcher) -> CellResult:
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        (spec.log_dir / "command.txt").write_text(launcher.reproducer(spec) + "\n")  # reruns the cell alone
        if run.matrix.device == "cpu" and spec.nproc > self.max_ranks and not launcher.remote:
            outcome = LaunchOutcome(
                reproducer=launcher.reproducer(spec),
                launcher=launcher.name,
                launch_error=(
                    f"{cell.world} ranks do not fit this machine: at most {self.max_ranks} "
                    f"(--simplefsdp-max-ranks; default one per GB of available memory)"
                ),
            )
        else:
            outcome = launcher.launch(spec)
        return build_result(cell, outcome, spec.log_dir, run.matrix.settings.get("steps"))

    def step_spec(self, run, cell, step, seed=None, port=None) -> LaunchSpec:
        """A step the cell's feature runs before it (e.g. precompile): one process, logs in <cell>/<step>/."""
        cell_dir = self.cell_dir(run, cell.id)
        command = run.target.step_command(cell, step, dump_folder=cell_dir / "dump", seed_folder=seed)
        command.env["SIMPLEFSDP_EVIDENCE_DIR"] = str(probe_folder(cell_dir / step))
        self.ask_footprint(command)
        return LaunchSpec(
            f"{cell.id}-{step}",
            command,
            1,
            cell_dir / step,
            self.cell_timeout(run),
            port or free_port(),
            self.settings.log_limit_bytes,
            device=run.matrix.device,
        )

    def _before(self, run, cell, seed, launcher, devices):
        """The cell's steps before it, in order: (the result of the first that failed, else None; a line per step
        that passed). A failed step is the cell's result, with its logs and reproducer."""
        passed = []
        for step in run.target.before_steps(cell):
            spec = self.step_spec(run, cell, step, seed)
            if devices is not None:
                spec.command.env["CUDA_VISIBLE_DEVICES"] = str(devices[0])
            spec.log_dir.mkdir(parents=True, exist_ok=True)
            (spec.log_dir / "command.txt").write_text(launcher.reproducer(spec) + "\n")
            done = build_result(Cell(cell.id, cell.axes, cell.world), launcher.launch(spec), spec.log_dir, trains=False)
            if done.status != Status.PASSED:
                done.fail(done.failure_class, f"{step} step: {done.error_line}", done.failing_rank, done.error_text)
                done.details.append(f"the {step} step ran before the cell (one process); its logs: {spec.log_dir}")
                return done, passed
            passed.append(f"the {step} step passed first ({done.wall:.0f} s, logs: {spec.log_dir})")
        return None, passed

    def _later_runs(self, run, cell, result, devices, seed, launcher):
        """A feature's later runs (e.g. resume a checkpoint on another layout): each must pass and must have
        loaded the checkpoint the run before it wrote; the cell's losses stay its first run's."""
        total = run.target.runs(cell)
        for later in range(1, total):
            spec = self.spec_for(run, cell, seed=seed, later=later)
            if devices is not None:
                spec.command.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
            again = self._launch(run, cell, spec, launcher)
            self.prove(run, cell_set(cell.axes), spec, again)
            what = f"run {later + 1} of {total}"
            if again.status != Status.PASSED:
                result.fail(again.failure_class, f"{what}: {again.error_line}", again.failing_rank, again.error_text)
                result.exit_codes, result.details = again.exit_codes, [*result.details, *again.details]
            elif not run.target.loaded_checkpoint(read_text(again.rank_logs.get(0, []))):
                result.fail(
                    FailureClass.INVALID_CONFIG,
                    f"{what} did not load the checkpoint of run {later}: its rank 0 log has no '{run.target.LOADED}'",
                )
            if result.status != Status.PASSED:
                result.details.append(f"logs of {what}: {spec.log_dir}")
                return
            steps = sorted(again.losses)
            result.details.append(
                f"{what} loaded the checkpoint and trained steps {steps[0]}-{steps[-1]} (logs: {spec.log_dir})"
            )

    def seed_spec(self, run, model, command, folder, port=None) -> LaunchSpec:
        return LaunchSpec(
            f"seed-{model}",
            command,
            1,
            folder,
            self.cell_timeout(run),
            port or free_port(),
            self.settings.log_limit_bytes,
            device=run.matrix.device,
        )

    def run_seed(self, run, model, command, folder, vset=None) -> CellResult | None:
        """One rank that writes the model's seed checkpoint (in the version set's environment); None when it did,
        else its failed result."""
        problem = self.sets.problem(run, vset) if vset is not None else None
        if problem:
            return CellResult.infra(Cell(f"seed-{model}", {}, 0), problem)
        self.prepare(run)  # the seed reads the target's assets too
        spec = self.seed_spec(run, model, command, folder)
        outcome = self.launcher_for(run).launch(spec)
        if (folder / "checkpoint" / "step-0").is_dir():
            return None
        return build_result(Cell(spec.cell_id, {}, 1), outcome, folder)


def not_launched(cell, spec) -> CellResult:
    """A cell asking for options its torchtitan does not have: invalid_config naming them and what asked for each,
    not launched. Its line (the signature's text) names no version: every commit before the option says the same, as
    a bisection needs; the details name the torchtitan."""
    errors = spec.command.lacking
    line = "; ".join(e.line() for e in errors) + ": not launched"
    result = CellResult(cell.id, dict(cell.axes), world=cell.world, mutant=getattr(cell, "mutant", None))
    result.fail(FailureClass.INVALID_CONFIG, line)
    result.details.extend(map(str, errors))
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    (spec.log_dir / "not_launched.txt").write_text("\n".join([line, *result.details]) + "\n")
    result.log_dir, result.reproducer = str(spec.log_dir), " ".join(map(str, spec.command.argv))
    return result
