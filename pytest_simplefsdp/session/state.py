"""A matrix session's state and its one way of running a cell: the settings, launcher, matrix runs, known
failures, runner, numerics book and result store, and a cell run, compared with its baseline, judged against
its known failures and recorded. The matrix's items and the ``simplefsdp_cell`` fixture both come through here."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import time
from pathlib import Path

import psutil
import pytest

from ..judge import mutants
from ..judge.decision import confirm_record, decide, record_decision, runs_to_pass
from ..judge.gate import base_record, numerics_vs_base
from ..judge.history import flaky_past
from ..judge.history import record as history_record
from ..judge.identity import identity
from ..judge.results import CellResult
from ..judge.verdict import Verdict
from ..kinds import FailureClass, KnownKind, RecordType, Status
from ..launch.procs import kill_procs, session_leftovers
from ..options import settings
from ..paths import output_root
from ..run.baselines import Book, Unavailable, numerics_too, param_stats
from ..run.runner import CellRunner
from ..spec.cells import first_id
from ..store.history import History, versions_of
from ..store.results import ResultStore
from ..versions.envs import Environments
from ..versions.sets import cell_set
from . import setup


class MatrixSession:
    def __init__(self, config, files=None):
        self.config = config
        s = settings(config)
        self.settings = s = dataclasses.replace(s, torchtitan_repo=setup.torchtitan_checkout(config, s))
        self.launcher = setup.make_launcher(config, s.dry_run)
        self.cache_dir = config.rootpath / ".simplefsdp"
        self.run_dir = s.artifacts or self.cache_dir / "runs" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # pytest-xdist: the controller names the run folder; each worker runs its cells (and its own seeds
        # and baselines) in a subfolder, and its records reach the controller on the test reports
        self.worker = getattr(config, "workerinput", None)
        if self.worker is not None and "simplefsdp_run_dir" in self.worker:
            self.run_dir = Path(self.worker["simplefsdp_run_dir"]) / self.worker["workerid"]
        elif getattr(config.option, "numprocesses", None):
            if s.jobs != 1:
                raise pytest.UsageError(
                    "--simplefsdp-jobs packs cells in one process; with pytest-xdist (-n) choose one of the two"
                )
            if s.dry_run:
                raise pytest.UsageError("--simplefsdp-dry-run lists the commands in one process: drop -n")
        self.max_ranks = s.max_ranks or max(1, int(psutil.virtual_memory().available / 1e9))
        self.base = None if s.dry_run else setup.resolve_base(config, s)  # --simplefsdp-base: judge.gate.Base
        self.changed = setup.resolve_changed(s, self.base)  # --simplefsdp-changed: setup.Changed
        self.selections = {}  # run name -> {ref, commit, files: {path: what it reaches}, selected, left_out}
        self.envs = Environments(self.cache_dir / "envs", s.fresh, s.torchtitan_repo)  # one per version set
        self.runner = CellRunner(
            s, self.launcher, self.run_dir, self.max_ranks, self.envs, self.cache_dir if s.footprint else None
        )
        self.chosen = {} if files else setup.cell_arguments(config)  # path -> cell ids named on the command line
        self.runs = setup.load_runs(config, s, files or list(self.chosen) or None, self.cache_dir)
        setup.check_named(self.chosen, self.runs)
        for run in self.runs:  # a version set's cells are spelled by its own torchtitan, once its environment is built
            run.target.python_for = lambda label, run=run: self.runner.sets.python(run, label)
            run.torchtitan_repo = s.torchtitan_repo
        self.version_lines = [] if s.dry_run else setup.check_versions(s, self.runs)  # unknown ones: a usage error
        self.not_here = setup.check_gpus(self.runs, self.runner)  # run -> why its cells cannot run on this machine
        self.unavailable = {} if s.dry_run else self.not_here  # (a dry run still lists them, and says why)
        self.mutants = setup.chosen_mutants(s, self.runs)  # run name -> [mutants.Mutant] of --simplefsdp-mutants
        self.known = setup.load_known(config, s, self.runs, self.cache_dir)
        self.runs_dirs = [self.cache_dir / "runs", *([s.artifacts.parent] if s.artifacts else [])]
        self.compared = setup.stored_run(s.compare, "compare", self.runs, self.runs_dirs)  # (what, run) or None
        about = {**(self.known.about() if self.known else {}), **({"base": self.base.about()} if self.base else {})}
        self.store = ResultStore(
            self.run_dir, self.runs, lambda run: self.runner.launcher_for(run).name, config.hook, config, about=about
        )
        self.store.selections = self.selections
        # --simplefsdp-history: every process reads a cell's earlier runs; the controller alone appends
        self.history = (
            None
            if s.history == "off" or s.dry_run or config.option.collectonly
            else History(s.history or self.cache_dir / "history.sqlite")
        )
        if self.worker is None:
            self.store.history = self.history
        self.book = Book(self.runner, self.store, self.run_dir, self.cache_dir, s.baseline, s.fresh, s.reuse_dir)
        self.packer = None  # run.schedule.Packer under --simplefsdp-jobs
        self.phases = {}  # cell key -> [(what it waits for now, since)]: the progress line names it
        if not (s.dry_run or config.option.collectonly):  # (a usage error above, or what only lists cells: nothing)
            output_root(self.cache_dir)

    # --- known failures -----------------------------------------------------------------------------

    def entries_for(self, run, cell):
        return self.known.for_cell(cell.axes, run.env(cell.axes)) if self.known else []

    def skip_entry(self, run, cell):
        return next((e for e in self.entries_for(run, cell) if e.kind == KnownKind.SKIP), None)

    @staticmethod
    def skipped_result(cell, entry, reason=None):
        """A cell that is not run: a skip entry's, or (entry None) the reason given."""
        return CellResult(
            cell.id,
            dict(cell.axes),
            status=Status.SKIPPED,
            world=cell.world,
            known_failure=entry and entry.id,
            known_failure_link=entry and entry.link,
            verdict=entry.reason if entry else reason,
        )

    @staticmethod
    def internal_error(cell, error: BaseException):
        """A cell the plugin itself failed on: recorded (never a lost result), then raised for its traceback."""
        return CellResult.infra(cell, f"pytest-simplefsdp failed on this cell: {type(error).__name__}: {error}")

    # --- running ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, run, cell, what):
        """While the block runs, the cell's progress line says it waits for ``what`` (its seed checkpoint, its
        baseline, a confirming run), not only for itself; nested phases stack (a confirming run's baseline)."""
        stack = self.phases.setdefault(run.key(first_id(cell.id)), [])
        stack.append((what, time.monotonic()))
        try:
            yield
        finally:
            stack.pop()

    def phase_of(self, key):
        """(what the cell waits for, since when) now, or None while it runs itself."""
        stack = self.phases.get(key)
        return (" > ".join(what for what, _ in stack), stack[-1][1]) if stack else None

    def run_and_check(self, run, cell, devices=None, check=True) -> CellResult:
        """Run a cell and, where the matrix asks for it (and ``check``), compare it with its baseline."""
        reused = self.book.reused(run, cell)
        if reused is not None:  # it already ran as a baseline
            return reused
        with self.phase(run, cell, "its seed checkpoint"):  # (instant where one is kept)
            seed = self.book.seed_for(run, cell)
        if isinstance(seed, Unavailable):
            return CellResult.infra(cell, seed.reason, culprit=seed.culprit)
        result = self.runner.run(run, cell, devices, seed=seed)
        if run.matrix.numerics and check:
            with self.phase(run, cell, "its baseline"):  # (the comparison itself is instant)
                self.book.check(run, cell, result)
                if cell.mutant:
                    numerics_too(self.book, run, cell, result)
        return result

    def run_judged(self, run, cell, packed=None):
        """The cell's judged result (a matrix item and the fixture alike): it runs, and a new failure runs again
        (confirm) and on a PR's base (against_base); what it all means is judge.decision's, decided once."""
        result = self.packer.result(packed) if self.packer and packed else self.run_and_check(run, cell)
        if cell.mutant:
            mutant = next(m for m in run.target.MUTANTS if m.name == cell.mutant)
            return mutants.judge(result, mutant), None
        entries = self.entries_for(run, cell)
        first = decide(result, entries, self.settings.gate, self.settings.update_known_failures)
        if first.status == Status.FAILED and result.failure_class and first.entry is None:
            result.history = self.history_of(run, cell, result)
            # (a culprit that passes on its rerun leaves the cell judged anew)
            self.confirm(run, cell, result, first.proving)
            if self.base is not None and result.status == Status.FAILED and result.failure_class:
                result.base = self.against_base(run, cell, result, entries)
        d = decide(
            result,
            entries,
            self.settings.gate,
            self.settings.update_known_failures,
            result.confirm,
            result.base,
            gated=self.base is not None,
            history=result.history,
            base_entries=self.base.entries if self.base else None,
        )
        if (
            d.status == Status.PASSED
            and self.base is not None
            and cell.smoke
            and result.status == Status.PASSED
            and self.settings.base_numerics != "off"
        ):
            if self.numerics_against_base(run, cell, result):  # --simplefsdp-base-numerics=fail, and it moved
                d = decide(
                    result,
                    entries,
                    self.settings.gate,
                    self.settings.update_known_failures,
                    None,
                    result.base,
                    gated=True,
                    history=result.history,
                    base_entries=self.base.entries,
                )
        record_decision(result, d)
        return result, Verdict(d.status, d.entry, d.verdict, d.flaky)

    def history_of(self, run, cell, result) -> dict | None:
        """A new failure's cell history: its newest earlier runs on the same versions (None: none kept)."""
        if self.history is None:
            return None
        rows = self.history.of(run.matrix.profile, cell.id, versions_of(run, result.versions))
        return history_record(rows, str(self.history.path)) if rows else None

    def numerics_against_base(self, run, cell, result) -> bool:
        """--simplefsdp-base-numerics: a passing smoke cell run once on the base (``<cell>/base-numerics-<set>-1/``,
        not compared with a baseline there) and compared with it (``result.base_numerics``). Under ``fail``, a change
        beyond the cell's tolerance fails the cell as numerics, with the base's passing run as its base record:
        True where it did."""
        lane = self.book.lane_of(run, cell, result)
        if lane is None:  # a matrix without numerics: nothing to compare
            return False
        with self.phase(run, cell, f"a run on the base {self.base.name()} (numerics)"):
            theirs = self.runs_on(
                run, cell, "torchtitan", "@" + self.base.commit, "base-numerics", runs=1, check=False
            )[0]
        if theirs.status != Status.PASSED:
            result.base_numerics = {
                **self.base.about(),
                "changed": None,
                "folder": theirs.log_dir,
                "line": f"not compared: the cell failed on the base {self.base.name()}: {theirs.error_line}",
            }
            return False
        record = numerics_vs_base(
            {"losses": result.losses, "stats": param_stats(result.log_dir)},
            {"losses": theirs.losses, "stats": param_stats(theirs.log_dir)},
            lane,
            self.base,
        )
        result.base_numerics = {**record, "folder": theirs.log_dir}
        if not (record["beyond"] and self.settings.base_numerics == "fail"):
            return False
        result.fail(FailureClass.NUMERICS, record["line"])
        result.base = base_record([theirs], self.base)
        return True

    def against_base(self, run, cell, result, entries) -> dict:
        """--simplefsdp-base: a new failure run again on the base's torchtitan (--simplefsdp-confirm runs, each in
        ``<cell>/base-<set>-<N>/``); its record (judge.gate.base_record). A flaky cell (its own runs disagree) and
        one that never ran are not run again."""
        flaky = decide(result, entries, confirm=result.confirm, history=result.history).flaky
        runs = []
        if not flaky and not result.not_run:
            with self.phase(run, cell, f"a run on the base {self.base.name()}"):
                runs = self.runs_on(run, cell, "torchtitan", "@" + self.base.commit, "base")
        return base_record(runs, self.base)

    def runs_on(self, run, cell, package, version, purpose, runs=None, check=True) -> list[CellResult]:
        """The cell with one package pinned (its version set's environment), ``runs`` (--simplefsdp-confirm) times,
        each judged as any cell (baseline of that set included, unless not ``check``), in
        ``<cell>/<purpose>-<set>-<N>/``: a bisection's probe, a PR's base."""
        vset = cell_set(cell.axes).with_pin(package, version)
        return [
            self.run_and_check(
                run,
                cell.attempt(f"{purpose}-{vset.slug()}-{n}", axes={**cell.axes, "versions": vset.label()}),
                check=check,
            )
            for n in range(1, (runs or self.settings.confirm) + 1)
        ]

    def confirm(self, run, cell, result, proving=None):
        """A failure is run again (each run in ``<cell>/confirm<N>/``) before it is reported: --simplefsdp-confirm
        runs in all for a new failure; for one a kind: flaky entry (``proving``) matches, or whose history shows it
        flaky, until a pass is likely by that pass rate (judge.decision.runs_to_pass), these extra runs stopping at
        the first pass. Its runs' record (``result.confirm``) is what judge.decision reads. A cell that did not run
        to its own end (SLURM cancelled it, srun refused it) is not run again: its failure is not the cell's."""
        planned, why = self.settings.confirm, ""
        past = flaky_past(result.history, identity(result))
        if proving is not None:
            planned, runs = 1, runs_to_pass(proving.pass_rate)
            why = f"entry {proving.id} says it passes {proving.pass_rate:.0%} of runs"
        elif past:
            runs = max(planned, runs_to_pass(past[1]))
            why = past[0] if runs > planned else ""
        else:
            runs = planned
        if runs <= 1 or result.not_run:  # a cell the launcher did not run (or someone stopped) shows nothing of its own
            return
        if result.culprit:
            return self.confirm_culprit(run, cell, result, runs)
        again = []
        for n in range(2, runs + 1):
            with self.phase(run, cell, f"confirming run {n} of {runs}"):
                again.append(self.run_attempt(run, cell, f"confirm{n}"))
            if n >= planned and any(r.status == Status.PASSED for r in again):
                break  # the runs past --simplefsdp-confirm look for a pass: one is enough
        result.confirm = confirm_record(result, again, why)

    def confirm_culprit(self, run, cell, result, runs):
        """A cell failed by its baseline or seed checkpoint (``culprit``): that job, not the cell, runs again, up to
        --simplefsdp-confirm runs in all; once it is had, the cell is compared with it (and then judged as any
        cell)."""
        culprit, first, made = result.culprit, result.error_line, None
        for n in range(2, runs + 1):
            with self.phase(run, cell, f"{culprit} again, run {n} of {runs}"):
                made = self.book.retry(run, cell, f"confirm{n}")
            if made is None:
                break
        ran = n if made is None else runs
        result.confirm = {"runs": 1, "culprit": culprit, "culprit_runs": ran, "culprit_passed": int(made is None)}
        if made is None:  # the culprit ran this time: the cell's own verdict, from its own run
            result.status, result.failure_class, result.culprit = Status.PASSED, None, None
            result.error_line = result.error_text = None
            self.book.check(run, cell, result)
            result.details.append(
                f"{culprit} failed once ({first}); it passed on run {ran} of {runs}, and this cell was compared with it"
            )

    def run_attempt(self, run, cell, attempt):
        """The cell once more, beside its first run (``<cell>/<attempt>/``), compared with its baseline."""
        again = cell.attempt(attempt)
        seed = self.book.seed_for(run, cell)
        result = self.runner.run(run, again, seed=None if isinstance(seed, Unavailable) else seed)
        own_baseline = run.matrix.numerics and run.target.baseline_axes(cell.axes) == cell.axes
        if run.matrix.numerics and not own_baseline and not isinstance(seed, Unavailable):
            self.book.check(run, again, result)  # (a cell that is its own baseline has nothing to be compared with)
        return result

    def record(self, run, result, kind=RecordType.CELL):
        if kind == RecordType.CELL:
            self.book.note(run, result)
        return self.store.record(run, result, kind)

    def run_one(self, path, cell_id, mutant=None):
        """The fixture API: run one cell (or one mutant of it) and judge it as a matrix item would."""
        run = next(r for r in self.runs if r.matrix.path.resolve() == Path(path).resolve())
        cell = run.cell(cell_id)
        if cell is None:
            raise pytest.UsageError(
                f"simplefsdp_cell: {run.matrix.path} has no valid cell {cell_id!r}; its cells: "
                f"{', '.join(c.id for c in run.cells[:20])}{' ...' if len(run.cells) > 20 else ''}"
            )
        if run.name in self.unavailable:
            pytest.skip(self.unavailable[run.name])
        skip = self.skip_entry(run, cell)
        if skip:
            pytest.skip(f"known failure {skip.id}: {skip.reason} ({skip.link})")
        if mutant:
            if mutant not in {m.name for m in run.target.MUTANTS}:
                raise pytest.UsageError(
                    f"simplefsdp_cell: unknown mutant {mutant!r} of target {run.target.name}; "
                    f"known: {', '.join(m.name for m in run.target.MUTANTS) or 'none'}"
                )
            cell = cell.mutated(mutant)
        result, _ = self.run_judged(run, cell)
        self.record(run, result)
        for rec in self.store.take_pending():
            self.store.collect(rec)
        return result

    def close(self):
        """The session's end: the launchers' servers and anything of this run still alive (the clean-up guarantee:
        nothing of this run may survive it). Returns (lines of what went wrong in the launchers during the run: a
        fork server that ended on its own, a close that failed; lines of the leftovers that had to be killed).
        It never raises: the session's report comes after it."""
        incidents = list(getattr(self.launcher, "incidents", list)())
        for step, what in (
            (lambda: self.packer and self.packer.close(), "stopping the cell packer"),
            (self.launcher.close, f"closing the {self.launcher.name} launcher"),
        ):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - reported in the summary, never a traceback that loses it
                incidents.append(f"{what} failed: {type(e).__name__}: {e}")
        leftovers, lines = [p for p in session_leftovers() if p.is_running()], []
        for p in leftovers:
            try:
                lines.append(f"pid {p.pid}: {' '.join(p.cmdline()[:6])}")
            except psutil.Error:
                pass
        kill_procs(leftovers)
        return incidents, lines
