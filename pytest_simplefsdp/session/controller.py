"""The controller of a matrix session (registered as a plugin under --simplefsdp-matrix, as pytest-xdist registers
its dsession): pytest's hooks for a matrix run. It turns the session's cells into items, packs them under
--simplefsdp-jobs, shows each cell's progress, takes the records the test reports carry, and at the end hands
them to the reporter (reporting.py). What a session holds and how a cell runs is state.py."""

from __future__ import annotations

import math
import os

import pytest

from ..kinds import Device
from ..machine import cuda_device_ids
from ..run.progress import Progress, estimate, stored_walls
from ..options import settings
from ..run.schedule import Packer
from .items import CellItem, MatrixCollector
from .reporting import Reporter
from .setup import check_plugins
from .state import MatrixSession


class Controller:
    def __init__(self, config):
        self.config = config
        self.header, self.exempt_from_timeout = check_plugins(config, settings(config))  # (before any loading)
        self.session = state = MatrixSession(config)
        self.settings, self.runs, self.worker = state.settings, state.runs, state.worker
        foreign = [e.id for e in state.known.entries if e.foreign] if state.known else []
        if foreign:
            self.header.append(f"simplefsdp: {len(foreign)} known-failure entries are for profiles not loaded "
                               f"here (not checked): {', '.join(foreign[:6])}{' ...' if len(foreign) > 6 else ''}")
        if config.option.verbose == 0:  # a line per cell (its outcome, time, ETA): a cell takes minutes
            config.option.verbose = 1
        self.progress = None
        self.shown = set()  # cells whose progress line was written
        self.reporter = Reporter(state)

    # --- collection ---------------------------------------------------------------------------------

    def pytest_ignore_collect(self, collection_path, config):
        return True  # matrix mode runs the matrix only

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        for run in self.runs:
            collector = MatrixCollector.from_parent(session, name=run.name, nodeid=run.name, run=run)
            cells = list(session.genitems(collector))  # reports the collection like any file's
            named = self.session.chosen.get(run.matrix.path.resolve())
            if named:  # cells named on the command line (pasted from a FAILED line): only those
                unknown = named - {i.cell.id for i in cells} - {i.cell.id.split("[mutant-")[0] for i in cells}
                if unknown:
                    raise pytest.UsageError(f"{run.matrix.path}: no valid cell {', '.join(sorted(unknown))}; "
                                            f"--simplefsdp-dry-run lists its cells")
                keep = [i for i in cells if i.cell.id in named or i.cell.id.split("[mutant-")[0] in named]
                config.hook.pytest_deselected(items=[i for i in cells if i not in keep])
                cells = keep
            items.extend(cells)

    def pytest_report_header(self, config):
        state = self.session
        return [f"simplefsdp: {run.name} profile={run.matrix.profile} target={run.target.name} "
                f"cells={len(run.cells)} n/a={len(run.dropped)} flags={run.target.spelling} "
                f"launcher={launcher_label(state, run)}" + (" DRY RUN" if self.settings.dry_run else "")
                + (f" SKIPPED: {state.unavailable[run.name]}" if run.name in state.unavailable else "")
                for run in self.runs] + self.header

    def pytest_collection_finish(self, session):
        cells = [item for item in session.items if isinstance(item, CellItem)]
        self.reporter.selected = [(item.run, item.cell) for item in cells]  # in collection order
        jobs = len(cells) if self.settings.jobs == "auto" else self.settings.jobs
        self.progress = self.reporter.progress = self._progress(cells, jobs)
        if self.settings.jobs == 1 or self.settings.dry_run or not cells:
            return
        state = self.session
        devices = cuda_device_ids() if any(i.run.matrix.device == Device.CUDA for i in cells) else []
        budget = self.settings.max_ranks or os.cpu_count() or 1
        if all(state.runner.launcher_for(i.run).remote for i in cells):
            # a scheduler hands out nodes and GPUs; only the number of cells at once is ours
            devices, budget = [], math.inf
        state.packer = Packer(jobs, budget, devices)
        for item in cells:
            if not state.skip_entry(item.run, item.cell) and item.run.name not in state.unavailable:
                state.packer.add(item.nodeid, item.cell.world,
                                 lambda devs, item=item: state.run_and_check(item.run, item.cell, devs))

    def _progress(self, cells, jobs):
        """Each selected cell's expected time: from the newest stored runs of its profile, else the estimate."""
        s, state = self.settings, self.session
        runs_dirs = {state.cache_dir / "runs", *([s.artifacts.parent] if s.artifacts else [])}
        walls = stored_walls(runs_dirs, {i.run.matrix.profile for i in cells})
        expected, used = {}, set()
        for item in cells:
            k, launcher = item.run.key(item.cell.id), state.runner.launcher_for(item.run).name
            if (k, launcher) in walls:
                expected[k] = walls[k, launcher][0]
                used.add((k, launcher))
            else:
                expected[k] = estimate(str(item.run.matrix.device), launcher, item.cell.world)
        # walls come newest run first: the first one used names the newest source
        source = next((folder for key, (_, folder) in walls.items() if key in used), None)
        return Progress(expected, min(jobs, len(cells) or 1), source, stored={k for k, _ in used})

    # --- while cells run ----------------------------------------------------------------------------

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
        node.workerinput["simplefsdp_run_dir"] = str(self.session.run_dir)

    def pytest_runtest_logreport(self, report):
        """Records arrive with the test reports, from this process or from an xdist worker alike."""
        if self.worker is None:
            for rec in getattr(report, "simplefsdp_records", None) or ():
                self.session.store.collect(rec)

    # --- the end ------------------------------------------------------------------------------------

    def pytest_sessionfinish(self, session):
        state = self.session
        for rec in state.store.take_pending():  # made before an interrupt, never reported: still stored
            if self.worker is None:
                state.store.collect(rec)
        self.reporter.leftover_lines = state.close()
        if self.reporter.leftover_lines:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.settings.update_known_failures and not self.settings.dry_run and self.worker is None:
            self.reporter.update_known_failures()

    def pytest_terminal_summary(self, terminalreporter):
        if self.worker is None:
            self.reporter.summary(terminalreporter)

    def pytest_unconfigure(self, config):
        self.session.store.close()


def launcher_label(state, run):
    chosen = state.runner.launcher_for(run).name
    return chosen if chosen == state.launcher.name else f"{chosen} ({state.launcher.name})"
