"""The controller of a matrix session (registered as a plugin under --simplefsdp-matrix, as pytest-xdist
registers its dsession): it loads the matrix files and known failures, checks what the machine offers,
turns the cells into items, runs each through the runner and the numerics book, judges it against the
known failures, and at the end writes the table, JSON, status file and the known-failures update from
the records the test reports carried."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from pathlib import Path

import psutil
import pytest

from . import lookahead, mutants, numerics, page, report
from .baselines import Book, Unavailable
from .items import CellItem, MatrixCollector
from .kinds import Device, FailureClass, Status
from .launch import LAUNCHERS, kill_procs, session_leftovers
from .matrix import MatrixError, SourceUnavailable
from .options import settings
from .profiles import MATRIX_DIR, MatrixRun, cuda_device_ids, matrix_files
from .results import CellResult
from .runner import CellRunner
from .schedule import Packer
from .store import ResultStore
from .targets import ROOT
from .progress import Progress, estimate, stored_walls
from .upstream import UPSTREAM_AXES
from .verdict import apply, could_apply, load_known_failures, update_file


def make_launcher(config, dry_run):
    name = config.getoption("simplefsdp_launcher") or config.getini("simplefsdp_launcher")
    launcher = config.hook.pytest_simplefsdp_make_launcher(config=config, name=name, dry_run=dry_run)
    if launcher is None:
        raise pytest.UsageError(f"--simplefsdp-launcher: unknown launcher {name!r}; built in: "
                                f"{', '.join([*LAUNCHERS, 'slurm'])} (plugins add more: pytest_simplefsdp_make_launcher)")
    return launcher


def load_runs(config, s, files, cache_dir):
    """The session's matrix files, loaded, expanded, and bound to what is installed."""
    try:
        runs = [MatrixRun(p, config, cache_dir, s.tier) for p in (files or matrix_files(s))]
        for run in runs:
            problem = run.target.check_installed()
            if problem and not s.dry_run:
                raise pytest.UsageError(problem)
            if not problem:  # flags spelled the way the installed torchtitan takes them (a dry run elsewhere: unchecked)
                run.target.bind(run.cells)
    except (MatrixError, RuntimeError) as e:
        raise pytest.UsageError(str(e)) from None
    return runs


def load_known(config, s, runs, cache_dir):
    """The known failures, each entry checked to be able to match a valid cell of some profile (every
    profile shipped or run counts; shipped ones in the real tier, since a tier's rules may drop more)."""
    path = s.known_failures
    if path is None:
        path = next((p for p in (config.rootpath / "known_failures.yaml", ROOT / "known_failures.yaml")
                     if p.exists()), None)
        if path is None:
            return None
    profiles, unloadable = list(runs), set()
    for p in MATRIX_DIR.glob("*.yaml"):
        if not any(r.matrix.path.resolve() == p.resolve() and r.matrix.tier == "real" for r in runs):
            try:
                profiles.append(MatrixRun(p, config, cache_dir))
            except SourceUnavailable:
                unloadable.add(p.stem)  # an upstream-sourced profile whose torchtitan is not installed here
            except MatrixError as e:  # a broken shipped profile is an error, not an unknown axis later
                raise pytest.UsageError(f"a shipped profile does not load: {e}") from None
    axis_names = {a for r in profiles for a in r.matrix.axes} | UPSTREAM_AXES
    try:
        known = load_known_failures(path, axis_names, allow_todo_links=s.update_known_failures,
                                    profiles={r.matrix.profile for r in profiles} | unloadable)
        for entry in known.entries:
            named = entry.when.get("profile")
            named = set(named if isinstance(named, list) else [named]) if named else set()
            if entry.foreign or (named and named <= unloadable):
                continue  # its profiles are not loaded (or cannot be, here): nothing to check it against
            if not any(could_apply(entry, c.axes, r.env()) for r in profiles for c in r.cells):
                raise MatrixError(f"{entry.where}: entry {entry.id!r} matches no valid cell of any profile "
                                  f"({', '.join(r.matrix.profile for r in profiles)})")
    except MatrixError as e:
        raise pytest.UsageError(str(e)) from None
    return known


def cell_arguments(config):
    """Positional arguments in matrix mode: matrix files, or cells as a FAILED line names them
    (``matrix/cpu.yaml::llama3-dp2-eager``, pasted back). Ordinary test paths are refused: this mode runs
    the matrix only. Returns {matrix path: cell ids (empty: all its cells)}."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return {}
    chosen = {}
    for arg in config.args:
        file, _, cell = arg.partition("::")
        file = file.removesuffix("[trace]")
        path = next((b / file for b in (config.invocation_params.dir, config.rootpath) if (b / file).is_file()), None)
        if path is None or path.suffix not in (".yaml", ".yml"):
            raise pytest.UsageError(f"{arg}: not a matrix file or a cell of one; --simplefsdp-matrix runs the "
                                    f"matrix only (drop it to run test files)")
        ids = chosen.setdefault(path.resolve(), set())
        if not cell:
            chosen[path.resolve()] = ids = None  # the whole file
        if ids is not None:
            ids.add(cell)
    config.args[:] = [str(config.invocation_params.dir)]  # nothing for pytest to collect: the cells are ours
    return {p: ids or set() for p, ids in chosen.items()}


def check_plugins(config, s):
    """Plugins that would fight the matrix's own mechanisms: refused with the way out, or told in the header.
    pytest-rerunfailures would run a cell again over its own folder and store it twice; pytest-timeout would
    interrupt the controller mid-cell (a traceback, the cell's record lost) where the supervisor times it.
    Returns (header lines, whether cells are exempt from an ini pytest-timeout)."""
    reruns = getattr(config.option, "reruns", None)
    if reruns:
        raise pytest.UsageError(f"--reruns {reruns} (pytest-rerunfailures): a matrix cell is not rerun; a cell "
                                f"that fails now and then is a `kind: flaky` entry in the known failures")
    if getattr(config.option, "timeout", None):
        raise pytest.UsageError(f"--timeout {config.option.timeout:g} (pytest-timeout): a cell is timed by its "
                                f"supervisor, which dumps the ranks' stacks and keeps the record: use "
                                f"--simplefsdp-timeout={config.option.timeout:g}")
    if config.pluginmanager.hasplugin("timeout") and float(config.getini("timeout") or 0) > 0:
        return [f"simplefsdp: the ini timeout ({config.getini('timeout')} s, pytest-timeout) does not apply to cells: "
                f"each has its own (--simplefsdp-timeout, else the matrix file's `timeout`)"], True
    return [], False


class Controller:
    def __init__(self, config, files=None):
        self.config = config
        self.settings = s = settings(config)
        self.launcher = make_launcher(config, s.dry_run)
        self.cache_dir = config.rootpath / ".simplefsdp"
        self.run_dir = s.artifacts or self.cache_dir / "runs" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # pytest-xdist: the controller names the run folder; each worker runs its cells (and its own seeds
        # and baselines) in a subfolder, and its records reach the controller on the test reports
        self.worker = getattr(config, "workerinput", None)
        if self.worker is not None and "simplefsdp_run_dir" in self.worker:
            self.run_dir = Path(self.worker["simplefsdp_run_dir"]) / self.worker["workerid"]
        elif getattr(config.option, "numprocesses", None):
            if s.jobs != 1:
                raise pytest.UsageError("--simplefsdp-jobs packs cells in one process; with pytest-xdist (-n) "
                                        "choose one of the two")
            if s.dry_run:
                raise pytest.UsageError("--simplefsdp-dry-run lists the commands in one process: drop -n")
        self.max_ranks = s.max_ranks or max(1, int(psutil.virtual_memory().available / 1e9))
        self.runner = CellRunner(s, self.launcher, self.run_dir, self.max_ranks)
        self.chosen = {} if files else cell_arguments(config)  # path -> cell ids named on the command line
        self.runs = load_runs(config, s, files or list(self.chosen) or None, self.cache_dir)
        self.header, self.exempt_from_timeout = [], False
        if files is None:  # the matrix session (not the fixture's controller inside an ordinary test run)
            self.header, self.exempt_from_timeout = check_plugins(config, s)
            if config.option.verbose == 0:  # a line per cell (its outcome, time, ETA): a cell takes minutes
                config.option.verbose = 1
        self.unavailable = {} if s.dry_run else self._check_gpus()  # run name -> why its cells cannot run here
        self.mutants = self._chosen_mutants()  # run name -> [mutants.Mutant] of --simplefsdp-mutants
        self.known = load_known(config, s, self.runs, self.cache_dir)
        foreign = [e.id for e in self.known.entries if e.foreign] if self.known else []
        if foreign:
            self.header.append(f"simplefsdp: {len(foreign)} known-failure entries are for profiles not loaded here "
                               f"(not checked): {', '.join(foreign[:6])}{' ...' if len(foreign) > 6 else ''}")
        self.compared = self._stored_run(s.compare, "compare")  # read now: a bad file is found before any cell runs
        self.store = ResultStore(self.run_dir, self.runs, lambda run: self.runner.launcher_for(run).name,
                                 config.hook, config)
        self.book = Book(self.runner, self.store, self.run_dir, self.cache_dir, s.baseline, s.fresh)
        self.selected = []
        self.packer = self.progress = None
        self.shown = set()  # cells whose progress line was written
        self.leftover_lines, self.update_lines = [], []

    def _check_gpus(self):
        """A GPU profile on a host with fewer GPUs is still collected (--co, -k work anywhere); its cells are
        skipped with the reason."""
        have, out = len(cuda_device_ids()), {}
        for run in self.runs:
            if run.matrix.device == Device.CUDA and not self.runner.launcher_for(run).remote:  # (trace tier: CPU)
                need = max((c.world for c in run.cells), default=0)
                if have < need:
                    out[run.name] = (f"profile {run.matrix.profile} needs {need} CUDA devices, {have} visible "
                                     f"(--simplefsdp-dry-run lists its commands; --simplefsdp-tier=trace runs it here)")
        return out

    @staticmethod
    def _stored_run(path, option):
        if path is None:
            return None
        try:
            return report.load_run(path)
        except SystemExit as e:
            raise pytest.UsageError(f"--simplefsdp-{option}: {e}") from None

    def _chosen_mutants(self):
        if not self.settings.mutants:
            return {}
        chosen = {}
        for run in self.runs:
            try:
                chosen[run.name] = mutants.parse_names(self.settings.mutants, run.target.MUTANTS)
            except ValueError as e:
                raise pytest.UsageError(f"--simplefsdp-mutants: {run.name} (target {run.target.name}): {e}") from None
        return chosen

    # --- known failures and verdicts -----------------------------------------------------------------

    def entries_for(self, run, cell):
        return self.known.for_cell(cell.axes, run.env()) if self.known else []

    def skip_entry(self, run, cell):
        return next((e for e in self.entries_for(run, cell) if e.kind == "skip"), None)

    @staticmethod
    def skipped_result(cell, entry, reason=None):
        """A cell that is not run: a skip entry's, or (entry None) the reason given."""
        return CellResult(cell.id, dict(cell.axes), status=Status.SKIPPED, world=cell.world,
                          known_failure=entry and entry.id, known_failure_link=entry and entry.link,
                          verdict=entry.reason if entry else reason)

    def apply_verdict(self, result, entries):
        """Judge a result against its known-failure entries and write the verdict into it."""
        return apply(result, entries, self.settings.gate)

    # --- running ------------------------------------------------------------------------------------

    def run_and_check(self, run, cell, devices=None) -> CellResult:
        """Run a cell and, where the matrix asks for it, compare it with its baseline."""
        reused = self.book.reused(run, cell)
        if reused is not None:  # it already ran as a baseline
            return reused
        seed = self.book.seed_for(run, cell)
        if isinstance(seed, Unavailable):
            return CellResult(cell.id, dict(cell.axes), status=Status.FAILED, failure_class=FailureClass.INFRA,
                              world=cell.world, error_line=seed.reason, error_text=seed.reason)
        result = self.runner.run(run, cell, devices, seed=seed)
        if run.matrix.numerics:
            self.book.check(run, cell, result)
        return result

    def run_judged(self, run, cell, packed=None):
        """The cell's judged result (a matrix item and the fixture alike) and, for a plain cell, its verdict."""
        result = self.packer.result(packed) if self.packer and packed else self.run_and_check(run, cell)
        if cell.mutant:
            mutant = next(m for m in run.target.MUTANTS if m.name == cell.mutant)
            return mutants.judge(result, mutant), None
        return result, self.apply_verdict(result, self.entries_for(run, cell))

    def record(self, run, result, kind="cell"):
        if kind == "cell":
            self.book.note(run, result)
        return self.store.record(run, result, kind)

    def run_one(self, path, cell_id, mutant=None):
        """The fixture API: run one cell (or one mutant of it) and judge it as a matrix item would."""
        run = next(r for r in self.runs if r.matrix.path.resolve() == Path(path).resolve())
        cell = run.cell(cell_id)
        if cell is None:
            raise pytest.UsageError(f"simplefsdp_cell: {run.matrix.path} has no valid cell {cell_id!r}; its cells: "
                                    f"{', '.join(c.id for c in run.cells[:20])}{' ...' if len(run.cells) > 20 else ''}")
        if run.name in self.unavailable:
            pytest.skip(self.unavailable[run.name])
        skip = self.skip_entry(run, cell)
        if skip:
            pytest.skip(f"known failure {skip.id}: {skip.reason} ({skip.link})")
        if mutant:
            if mutant not in {m.name for m in run.target.MUTANTS}:
                raise pytest.UsageError(f"simplefsdp_cell: unknown mutant {mutant!r} of target {run.target.name}; "
                                        f"known: {', '.join(m.name for m in run.target.MUTANTS) or 'none'}")
            cell = dataclasses.replace(cell, id=f"{cell.id}[mutant-{mutant}]", mutant=mutant)
        result, _ = self.run_judged(run, cell)
        self.record(run, result)
        for rec in self.store.take_pending():
            self.store.collect(rec)
        return result

    def close(self):
        self.launcher.close()
        kill_procs(session_leftovers())
        self.store.close()

    # --- pytest hooks: collection -------------------------------------------------------------------

    def pytest_ignore_collect(self, collection_path, config):
        return True  # matrix mode runs the matrix only

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        for run in self.runs:
            collector = MatrixCollector.from_parent(session, name=run.name, nodeid=run.name, run=run)
            cells = list(session.genitems(collector))  # reports the collection like any file's
            named = self.chosen.get(run.matrix.path.resolve())
            if named:  # cells named on the command line (pasted from a FAILED line): only those
                unknown = named - {i.cell.id for i in cells} - {i.cell.id.split("[mutant-")[0] for i in cells}
                if unknown:
                    raise pytest.UsageError(f"{run.matrix.path}: no valid cell {', '.join(sorted(unknown))}; "
                                            f"--simplefsdp-dry-run lists its cells")
                keep = [i for i in cells if i.cell.id in named or i.cell.id.split("[mutant-")[0] in named]
                config.hook.pytest_deselected(items=[i for i in cells if i not in keep])
                cells = keep
            items.extend(cells)

    def _launcher_label(self, run):
        chosen = self.runner.launcher_for(run).name
        return chosen if chosen == self.launcher.name else f"{chosen} ({self.launcher.name})"

    def pytest_report_header(self, config):
        return [f"simplefsdp: {run.name} profile={run.matrix.profile} target={run.target.name} "
                f"cells={len(run.cells)} n/a={len(run.dropped)} flags={run.target.spelling} "
                f"launcher={self._launcher_label(run)}" + (" DRY RUN" if self.settings.dry_run else "")
                + (f" SKIPPED: {self.unavailable[run.name]}" if run.name in self.unavailable else "")
                for run in self.runs] + self.header

    def pytest_collection_finish(self, session):
        cells = [item for item in session.items if isinstance(item, CellItem)]
        self.selected = [(item.run, item.cell) for item in cells]  # in collection order
        jobs = len(cells) if self.settings.jobs == "auto" else self.settings.jobs
        self.progress = self._progress(cells, jobs)
        if self.settings.jobs == 1 or self.settings.dry_run or not cells:
            return
        devices = cuda_device_ids() if any(i.run.matrix.device == Device.CUDA for i in cells) else []
        budget = self.settings.max_ranks or os.cpu_count() or 1
        if all(self.runner.launcher_for(i.run).remote for i in cells):
            # a scheduler hands out nodes and GPUs; only the number of cells at once is ours
            devices, budget = [], math.inf
        self.packer = Packer(jobs, budget, devices)
        for item in cells:
            if not self.skip_entry(item.run, item.cell) and item.run.name not in self.unavailable:
                self.packer.add(item.nodeid, item.cell.world,
                                lambda devs, item=item: self.run_and_check(item.run, item.cell, devs))

    def _progress(self, cells, jobs):
        """Each selected cell's expected time: from the newest stored runs of its profile, else the estimate."""
        runs_dirs = {self.cache_dir / "runs", *( [self.settings.artifacts.parent] if self.settings.artifacts else [])}
        walls = stored_walls(runs_dirs, {i.run.matrix.profile for i in cells})
        expected, used = {}, set()
        for item in cells:
            k, launcher = item.run.key(item.cell.id), self.runner.launcher_for(item.run).name
            if (k, launcher) in walls:
                expected[k] = walls[k, launcher][0]
                used.add((k, launcher))
            else:
                expected[k] = estimate(str(item.run.matrix.device), launcher, item.cell.world)
        # walls come newest run first: the first one used names the newest source
        source = next((folder for key, (_, folder) in walls.items() if key in used), None)
        return Progress(expected, min(jobs, len(cells) or 1), source, stored={k for k, _ in used})

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        """A cell's verbose line ends with its time and the run's progress: cells done, elapsed, ETA."""
        res = yield
        records = getattr(report, "simplefsdp_records", None)
        if report.when != "call" or not records or not res or self.progress is None or report.nodeid in self.shown:
            return res  # (the short summary asks again: it gets the plain word)
        self.shown.add(report.nodeid)
        run = next((r for r in self.runs if r.name == records[-1]["matrix"]), None)
        if run is not None:
            self.progress.finished(run.key(records[-1]["id"]), records[-1].get("wall") or 0.0)
        category, letter, word = res
        text, markup = word if isinstance(word, tuple) else (word, {})
        if text:
            text = f"{text} {records[-1].get('wall') or 0:.0f}s ({self.progress.line()})"
        return category, letter, (text, markup) if markup else text

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """pytest-xdist, on the controller: every worker writes under this run's folder."""
        node.workerinput["simplefsdp_run_dir"] = str(self.run_dir)

    def pytest_runtest_logreport(self, report):
        """Records arrive with the test reports, from this process or from an xdist worker alike."""
        if self.worker is None:
            for rec in getattr(report, "simplefsdp_records", None) or ():
                self.store.collect(rec)

    # --- pytest hooks: the end ----------------------------------------------------------------------

    def pytest_sessionfinish(self, session):
        for rec in self.store.take_pending():  # made before an interrupt, never reported: still stored
            if self.worker is None:
                self.store.collect(rec)
        if self.packer:
            self.packer.close()
        self.launcher.close()  # the fork servers end with the session
        leftovers = session_leftovers()  # the clean-up guarantee: nothing of this run may survive it
        if leftovers:
            self.leftover_lines = [f"pid {p.pid}: {' '.join(p.cmdline()[:6])}" for p in leftovers if p.is_running()]
            kill_procs(leftovers)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.settings.update_known_failures and not self.settings.dry_run and self.worker is None:
            self.update_known_failures()

    def update_known_failures(self):
        path = self.known.path if self.known else (self.settings.known_failures
                                                   or self.config.rootpath / "known_failures.yaml")
        runs = {run.name: run for run in self.runs}
        cells = [(runs[r["matrix"]], CellResult.from_record(r)) for r in self.store.records
                 if r["type"] == "cell" and not r.get("mutant")]
        new = [(run.matrix.profile, r) for run, r in cells if r.status == Status.FAILED and not r.known_failure
               and r.failure_class]
        outcomes = {}  # known-failure id -> [cell passed?] for the cells it applied to
        for run, r in cells:
            for e in self.entries_for(run, r):
                outcomes.setdefault(e.id, []).append(r.failure_class is None)
        xfails = {e.id for e in (self.known.entries if self.known else []) if e.kind == "xfail"}
        passing = {eid for eid, passed in outcomes.items() if all(passed) and eid in xfails}
        self.update_lines = update_file(path, new, passing, datetime.date.today().isoformat())
        self.update_path = path

    def pytest_terminal_summary(self, terminalreporter):
        if self.worker is not None:
            return
        if self.settings.dry_run:
            lookahead.summary(self, terminalreporter)
            if self.settings.coverage:
                self._coverage(terminalreporter)
            return
        tr = terminalreporter
        doc = self.store.document()
        for run, run_doc in zip(self.runs, doc["runs"]):  # the seed checkpoints the cells started from
            if self.book.seed_records.get(run.name):
                run_doc["seeds"] = self.book.seed_records[run.name]
        if self.store.records and (self.settings.html or self.settings.status_md):
            doc["walltime_plot"] = numerics.walltime_plot(self.run_dir.resolve() / report.WALLTIME_PLOT, doc)
        if self.compared is not None:
            doc["comparison"] = report.compare_runs(self.compared, doc)
            tr.section(f"simplefsdp: changes since {self.settings.compare}")
            for line, good in report.change_lines(doc["comparison"]):
                tr.write_line(line, red=not good, green=good)
        if self.leftover_lines:
            tr.section("simplefsdp: processes outlived the run (killed now)", red=True)
            for line in self.leftover_lines:
                tr.write_line(line, red=True)
        tr.section("simplefsdp composability")
        for line in self.update_lines:
            tr.write_line(f"{self.update_path}: {line}")
        tr.write_line(report.render_text(doc))
        if self.store.jsonl is not None:
            tr.write_line(f"results: {self.store.path}")
        for run_doc in doc["runs"]:
            for seed in run_doc.get("seeds", []):
                tr.write_line(f"seed checkpoint {seed['model']}: "
                              + ("kept from an earlier run" if seed["kept_from_earlier_run"] else "made and kept")
                              + f" ({seed['folder']}; --simplefsdp-fresh makes it again)")
        self._write_files(tr, doc)
        if self.settings.coverage:
            self._coverage(tr)
        self.config.hook.pytest_simplefsdp_report(config=self.config, doc=doc)

    def _coverage(self, tr):
        """--simplefsdp-coverage: the upstream suite's coverage by the shipped profiles, written and summed up."""
        from . import upstream

        path = self.settings.coverage
        try:
            cov = upstream.report(self.known.path if self.known else None)
        except (LookupError, MatrixError) as e:
            tr.write_line(f"simplefsdp coverage: not written: {e}", red=True)
            return
        fmt = {".md": "md", ".json": "json"}.get(path.suffix, "text")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(upstream.render(cov, fmt))
        tr.write_line(upstream.render(cov).splitlines()[0] + f" (report: {path})")

    def _write_files(self, tr, doc):
        for path, text, what in ((self.settings.status_md, lambda: report.render_md(doc), "status table"),
                                 (self.settings.json, lambda: json.dumps(doc, indent=1) + "\n", "json report")):
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text())
                tr.write_line(f"{what}: {path}")
        if self.settings.html:
            tr.write_line(f"html page: {page.write(doc, self.settings.html)}")

    def pytest_unconfigure(self, config):
        self.store.close()
