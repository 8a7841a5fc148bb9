"""The controller of a matrix session (registered as a plugin under --simplefsdp-matrix, as pytest-xdist registers
its dsession): pytest's hooks for a matrix run. It turns the session's cells into items, packs them under
--simplefsdp-jobs, shows each cell's progress, takes the records the test reports carry, and at the end hands
them to the reporter (reporting.py). What a session holds and how a cell runs is state.py."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time

import pytest

from ..kinds import Device
from ..machine import cuda_device_ids
from ..options import settings
from ..run.progress import Progress, duration, estimate, stored_walls
from ..run.schedule import Packer
from ..spec.cells import named_by, value_id
from ..spec.paths import select
from ..store import footprints
from ..versions.git import find_commit
from ..words import plural
from ..yamlio import MatrixError
from .bisecting import Bisector
from .compiling import PACKAGE, CompilerBisector
from .items import CellItem, MatrixCollector
from .reporting import Reporter
from .sentinel import Sentinel
from .setup import changes_since, check_plugins
from .state import MatrixSession


class Controller:
    def __init__(self, config):
        self.config = config
        self.header, self.exempt_from_timeout = check_plugins(config, settings(config))  # (before any loading)
        self.session = state = MatrixSession(config)
        self.settings, self.runs, self.worker = state.settings, state.runs, state.worker
        self.header += state.version_lines
        if state.base is not None:
            self.header.append(
                f"simplefsdp: PR gate: each failure runs again on base {state.base.name()} of "
                f"{state.base.repo}; only new failures fail the run"
            )
        entries = state.known.entries if state.known else []
        for what, ids in (
            ("are for profiles not loaded here (not checked)", [e.id for e in entries if e.foreign]),
            ("have no link yet (TODO: name the upstream issue)", [e.id for e in entries if e.todo]),
        ):
            if ids:
                self.header.append(
                    f"simplefsdp: {len(ids)} known-failure entries {what}: {', '.join(ids[:6])}"
                    f"{' ...' if len(ids) > 6 else ''}"
                )
        # -v asked for: the report lists every cell's numerics and evidence (a green run says them in two lines)
        self.verbose = config.option.verbose > 0
        if config.option.verbose == 0:  # a line per cell (its outcome, time, ETA): a cell takes minutes
            config.option.verbose = 1
        self.progress = None
        self.shown = set()  # cells whose progress line was written
        self.keys, self.ticker = {}, None  # node id -> cell key; the running cell's line
        self.change_lines = []  # --simplefsdp-changed: what the change reaches, said after collection
        self.reporter = Reporter(state, self.verbose)

    # --- collection ---------------------------------------------------------------------------------

    def pytest_ignore_collect(self, collection_path, config):
        return True  # matrix mode runs the matrix only

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        for run in self.runs:
            collector = MatrixCollector.from_parent(session, name=run.name, nodeid=run.name, run=run)
            cells = list(session.genitems(collector))  # reports the collection like any file's
            named = self.session.chosen.get(run.matrix.path.resolve())
            if named:  # cells named on the command line (pasted from a FAILED line), on every version set: only those
                keep = [i for i in cells if named_by(run.matrix, i.cell) & named]
                config.hook.pytest_deselected(items=[i for i in cells if i not in keep])
                cells = keep
            if self.session.changed is not None:
                cells = self.reached(run, cells, config)
            items.extend(cells)

    def reached(self, run, cells, config):
        """--simplefsdp-changed: the cells the checkout's changes can reach (spec.paths, the target's map); the rest
        deselected, and said: which files, what each reaches, how many cells were left out."""
        changed = self.session.changed
        try:
            rules = run.target.path_rules()
        except MatrixError as e:
            raise pytest.UsageError(f"--simplefsdp-changed: {e}") from None
        if rules is None:
            raise pytest.UsageError(
                f"--simplefsdp-changed: target {run.target.name!r} of {run.name} has no map of "
                f"torchtitan paths (matrix/paths/<target>.yaml)"
            )
        selection, since = self.selection(run, rules, changed)
        keep = [i for i in cells if selection.reaches(i.cell.id, i.cell.axes)]
        left = [i for i in cells if i not in keep]
        config.hook.pytest_deselected(items=[i for i in cells if i not in keep])
        why, not_gated = selection.why([(i.cell.id, i.cell.axes) for i in cells])
        traced = sum(1 for i in cells if i.cell.id in selection.prints)
        self.session.selections[run.name] = {
            **changed.about(),
            "files": why,
            "not_gated": not_gated,
            "footprints": {"commit": selection.made_at, "cells": traced} if traced else None,
            "selected": len(keep),
            "left_out": [i.cell.id for i in left],
        }
        by = (
            f"by what {traced} of its cells ran at {selection.made_at[:12]} (the map for the rest)"
            if traced
            else "by the map of torchtitan paths (no footprints kept: --simplefsdp-footprint makes them)"
        )
        self.change_lines.append(
            f"simplefsdp: --simplefsdp-changed: {plural(len(why), 'file')} changed since "
            f"{changed.ref} ({changed.commit}){since} reach {len(keep)} of {len(cells)} cells of "
            f"{run.name}, {by}; {len(left)} left out"
        )
        self.change_lines += [f"    {path}: {what}" for path, what in list(why.items())[:12]]
        if len(why) > 12:
            self.change_lines.append(f"    ... and {len(why) - 12} more (the JSON's meta.changed lists them all)")
        if not_gated:
            self.change_lines.append(
                f"simplefsdp: NOT GATED HERE: {plural(len(not_gated), 'changed file')} reach no cell of {run.name}: "
                + "; ".join(f"{p}: {w}" for p, w in list(not_gated.items())[:6])
            )
        return keep

    def selection(self, run, rules, changed):
        """(the selection, what the diff was taken since where not the base): the footprints kept for the base
        commit, else for its nearest kept ancestor (the diff then taken from that commit: sound for what it ran)."""
        repo, profile = changed.repo, value_id(run.matrix.profile)
        base = find_commit(repo, changed.commit)
        made_at = footprints.nearest(self.session.cache_dir, repo, base, profile)
        if made_at is None:
            return select(rules, changed.changes), ""
        changes = changed.changes if made_at == base else changes_since(repo, made_at)
        since = "" if made_at == base else f" (and since {made_at[:12]}, where its footprints were made)"
        return select(rules, changes, footprints.load(self.session.cache_dir, made_at, profile), made_at), since

    def pytest_report_collectionfinish(self, config, start_path, items):
        return self.change_lines  # (after pytest's "collected N items / M deselected")

    def pytest_report_header(self, config):
        state = self.session
        return [
            f"simplefsdp: {run.name} profile={run.matrix.profile} target={run.target.name} "
            f"cells={len(run.cells)} n/a={len(run.dropped)} flags={run.target.spelling} "
            f"launcher={launcher_label(state, run)}"
            + (" DRY RUN" if self.settings.dry_run else "")
            + (f" SKIPPED: {state.unavailable[run.name]}" if run.name in state.unavailable else "")
            for run in self.runs
        ] + self.header

    def pytest_collection_finish(self, session):
        cells = [item for item in session.items if isinstance(item, CellItem)]
        self.reporter.selected = [(item.run, item.cell) for item in cells]  # in collection order
        self.keys = {item.nodeid: item.run.key(item.cell.id) for item in cells}
        jobs = len(cells) if self.settings.jobs == "auto" else self.settings.jobs
        self.progress = self.reporter.progress = self._progress(self.reporter.selected, jobs)
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
                state.packer.add(
                    item.nodeid,
                    item.run.processes(item.cell),
                    lambda devs, item=item: state.run_and_check(item.run, item.cell, devs),
                )

    def _progress(self, cells, jobs):
        """Each selected cell's expected time: from the newest stored runs of its profile run by the launcher that
        will run it now, else the estimate. ``cells``: (run, cell) in collection order."""
        state = self.session
        walls = stored_walls(set(state.runs_dirs), {run.matrix.profile for run, _ in cells})
        expected, used = {}, set()
        for run, cell in cells:
            k, launcher = run.key(cell.id), state.runner.launcher_name(run, cell)
            if (k, launcher) in walls:
                expected[k] = walls[k, launcher][0]
                used.add((k, launcher))
            else:
                expected[k] = estimate(str(run.matrix.device), launcher, cell.world)
        # walls come newest run first: the first one used names the newest source
        source = next((folder for key, (_, folder) in walls.items() if key in used), None)
        return Progress(expected, min(jobs, len(cells) or 1), source, stored={k for k, _ in used})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """pytest-xdist, on the controller: the cells the workers collected, for the ETA of each line."""
        if self.progress is None:
            cells = {f"{run.name}::{cell.id}": (run, cell) for run in self.runs for cell in run.cells}
            self.progress = self._progress([cells[i] for i in ids if i in cells], len(ids))

    # --- while a cell runs: its line shows how long it has run, against how long it should take ------------

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid, location):
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        cell = self.keys.get(nodeid)
        if (
            tr is not None
            and cell is not None
            and self.progress is not None
            and not self.settings.dry_run
            and self.worker is None
            and tr.verbosity > 0
        ):
            self.ticker = Ticker(tr, nodeid, self.progress.expected.get(cell), lambda: self.session.phase_of(cell))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        """Records arrive with the test reports, from this process or from an xdist worker alike."""
        if (
            self.ticker is not None
            and self.ticker.nodeid == report.nodeid
            and (report.when != "setup" or not report.passed)
        ):  # (the cell runs in the call phase, after setup's report)
            self.ticker.stop()
            self.ticker = None
        if self.worker is None:
            for rec in getattr(report, "simplefsdp_records", None) or ():
                self.session.store.collect(rec)

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

    # --- the end ------------------------------------------------------------------------------------

    def pytest_sessionfinish(self, session):
        state = self.session
        for rec in state.store.take_pending():  # made before an interrupt, never reported: still stored
            if self.worker is None:
                state.store.collect(rec)
        if (
            self.settings.bisect
            and not self.settings.dry_run
            and self.worker is None
            and not self.config.option.collectonly
        ):
            bisector = Bisector(state)
            if self.settings.bisect == PACKAGE:  # inside the installed versions: which compiler step
                bisector = CompilerBisector(state, bisector)
            self.reporter.bisections = bisector.run(state.store.records, self.reporter.selected)
        if (
            self.settings.sentinel
            and not self.settings.dry_run
            and self.worker is None
            and not self.config.option.collectonly
        ):
            sentinel = Sentinel(state, self.settings.sentinel)
            self.reporter.bisections = sentinel.run(state.store.records, self.reporter.selected)
            self.reporter.sentinel_lines = sentinel.write(
                state.store.records, self.reporter.selected, self.reporter.bisections
            )
        self.reporter.incidents, self.reporter.leftover_lines = state.close()
        if (
            session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
            and state.selections
            and not any(sel["selected"] or sel["not_gated"] for sel in state.selections.values())
        ):
            session.exitstatus = pytest.ExitCode.OK  # a change no cell can reach (docs, tests): nothing to gate
        # (one that reaches only cells this profile has not stays "no tests ran": not gated here is not a pass)
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
    """The launcher that will run the matrix's cells, and why where it is not the one asked for."""
    chosen = state.runner.launcher_for(run).name
    actual = state.runner.launcher_name(run, run.cells[0]) if run.cells else chosen
    why = f"{state.launcher.name}'s choice for {run.matrix.device} cells" if chosen != state.launcher.name else ""
    if actual != chosen:
        why = f"{chosen} runs this target's program under {actual}" + (f"; {why}" if why else "")
    return f"{actual} ({why})" if why else actual


class Ticker:
    """The running cell's line in the terminal: on a TTY rewritten every second with how long the cell has run and
    how long it should take; elsewhere a plain line every minute. Stopped before pytest writes the cell's outcome,
    which then lands on the cell's own line."""

    TTY_S, PLAIN_S = 1.0, 60.0

    def __init__(self, tr, nodeid, expected, phase=lambda: None):
        self.tr, self.nodeid, self.expected, self.phase = tr, nodeid, expected, phase
        self.prefix = tr.currentfspath if isinstance(tr.currentfspath, str) else None
        self.start, self.done = time.monotonic(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def text(self):
        now = time.monotonic()
        text = f"running {duration(now - self.start)}" + (
            f" of ~{duration(self.expected)} expected" if self.expected else ""
        )
        phase = self.phase()  # what it waits for besides itself: its seed checkpoint, its baseline, a rerun
        return text + (f": {phase[0]} for {duration(now - phase[1])}" if phase else "")

    def _run(self):
        tty = self.tr.isatty and self.prefix is not None
        capture = self.tr.config.pluginmanager.getplugin("capturemanager")
        while not self.done.wait(self.TTY_S if tty else self.PLAIN_S):
            # the cell runs in the call phase, whose output pytest captures (the ranks write to their logs, not
            # here): the line goes past the capture to the terminal
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                if tty:
                    self.tr.rewrite(f"{self.prefix}{self.text()}", erase=True)
                else:
                    self.tr.write_line(f"    {self.nodeid}: {self.text()}")
                self.tr.flush()

    def stop(self):
        self.done.set()
        self.thread.join()
        if self.tr.isatty and self.prefix is not None and self.tr.currentfspath == self.prefix:
            self.tr.rewrite(self.prefix, erase=True)  # the outcome goes right after the cell's name again
            self.tr.rewrite(self.prefix)
