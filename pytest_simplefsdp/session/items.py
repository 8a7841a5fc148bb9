"""Collection: one collector per matrix file, one test item per cell (or per mutant of a cell under
--simplefsdp-mutants). An item asks the controller to run its cell and turns the judged result into
the standard pytest outcome: passed, failed, skipped, xfailed or xpassed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ..keys import CONTROLLER
from ..kinds import Mutation, Status
from ..paths import shown
from ..spec.cells import Cell, rerun_command
from .compiling import compiled


def controller_of(config):
    """The session's Controller (put on config.stash by the plugin's pytest_configure)."""
    return config.stash[CONTROLLER]


class MatrixCollector(pytest.Collector):
    def __init__(self, *, run, **kwargs):
        super().__init__(**kwargs)
        self.run = run

    def collect(self):
        for cell in self._cells():
            item = CellItem.from_parent(self, name=cell.id, run=self.run, cell=cell)
            item.add_marker(pytest.mark.simplefsdp)
            if controller_of(self.config).exempt_from_timeout:
                item.add_marker(pytest.mark.timeout(0))  # an ini pytest-timeout: the supervisor times cells
            if cell.smoke:
                item.add_marker(pytest.mark.smoke)
            for group, entries in self.run.matrix.groups.items():
                if any(e.matches(cell.axes) for e in entries):
                    item.extra_keyword_matches.add(group)
            yield item

    def _cells(self):
        """The matrix's cells; under --simplefsdp-mutants, each cell once per mutant that applies to it
        (cells with a known failure are left out: a gate cannot be tested where the cell already fails)."""
        state = controller_of(self.config).session
        chosen = state.mutants.get(self.run.name)
        if not chosen:
            yield from self.run.cells
            return
        for cell in self.run.cells:
            if not state.entries_for(self.run, cell):
                for m in chosen:
                    if m.applies(cell.axes):
                        yield cell.mutated(m.name)


class CellFailed(Exception):
    def __init__(self, result):
        super().__init__(result.error_line)
        self.result = result


class MutantNotKilled(Exception):
    def __init__(self, result):
        super().__init__(result.verdict)
        self.result = result


class CellItem(pytest.Item):
    def __init__(self, *, run, cell: Cell, **kwargs):
        super().__init__(**kwargs)
        self.run, self.cell = run, cell
        self.user_properties.append(("axes", json.dumps(cell.axes)))
        self.user_properties.extend((f"axis.{k}", v) for k, v in cell.axes.items())  # dashboards slice by axis

    def runtest(self):
        state = controller_of(self.config).session
        if state.settings.dry_run:
            pytest.skip("dry run: not launched")
        if self.run.name in state.unavailable:
            state.record(self.run, state.skipped_result(self.cell, None, state.unavailable[self.run.name]))
            pytest.skip(state.unavailable[self.run.name])
        skip = state.skip_entry(self.run, self.cell)
        if skip:
            state.record(self.run, state.skipped_result(self.cell, skip))
            self.user_properties.append(("known_failure", skip.id))
            pytest.skip(f"known failure {skip.id}: {skip.reason} ({skip.link})")
        start = time.monotonic()
        try:
            result, verdict = state.run_judged(self.run, self.cell, packed=self.nodeid)
        except Exception as e:  # a bug of ours: the cell's record says so, and pytest shows the traceback
            state.record(self.run, state.internal_error(self.cell, e))
            raise
        state.record(self.run, result)
        self.user_properties.append(("wall_s", round(time.monotonic() - start, 2)))
        if self.cell.mutant:
            self.user_properties.append(("killed_by", result.killed_by or ""))
            if result.mutation != Mutation.KILLED:
                raise MutantNotKilled(result)
            return
        if verdict.entry:
            self.user_properties.append(("known_failure", verdict.entry.id))
        if result.failure_class:
            self.user_properties.append(("failure_class", str(result.failure_class)))
            # a rank's own words, as plain text (junit-xml escapes it: an attribute value, never markup)
            self.user_properties.append(("error_line", str(result.error_line or "")))
            if result.failing_rank is not None:
                self.user_properties.append(("failing_rank", str(result.failing_rank)))
        if result.gate:
            self.user_properties.append(("gate", str(result.gate)))
        if result.status == Status.XFAILED:
            pytest.xfail(result.verdict or verdict.message)
        if result.status == Status.XPASSED:
            self.xpass_reason = verdict.message
        if result.status == Status.FAILED:
            raise CellFailed(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MutantNotKilled):
            r = excinfo.value.result
            return f"{r.id}: {r.verdict}\n  logs: {r.log_dir}\n  rerun: {r.reproducer}"
        if isinstance(excinfo.value, CellFailed):
            return failure_text(
                excinfo.value.result,
                rerun_command(self.run.name, self.cell.id, self.cell.axes, self.run.matrix.tier),
                self.config.rootpath,
            )
        # a bug of ours (the cell's record says so): its traceback without pytest's and pluggy's frames
        own = excinfo.traceback.filter(lambda e: not any(p in str(e.path) for p in ("/_pytest/", "/pluggy/")))
        if own:
            excinfo.traceback = own
        return super().repr_failure(excinfo, style="short")

    def reportinfo(self):
        line = self.cell.where.rpartition(":")[2]
        # pytest shows a node id that ends with this name with its dots as "::" (a Python domain's habit):
        # `-torch-2.15.0` would read `-torch-2::15::0`; a name that does not end the id keeps the id as it is
        name = self.cell.id + (" " if "." in self.cell.id else "")
        return self.run.matrix.path, int(line) - 1 if line.isdigit() else None, name


def failure_text(r, rerun, root="."):
    """What pytest prints for a failed cell: class and first error line, verdict, rank, logs, the command that runs
    it again (portable: ``rerun``) and where its ranks' own command lies."""
    if not r.failure_class:  # a pass that a gate turns into a failure
        return f"{r.id}: [XPASS(strict)] {r.verdict}"
    lines = [f"{r.id}: [{r.failure_class}] {r.error_line}"]
    if r.verdict:
        lines.append(f"  {r.verdict}")
    if r.failing_rank is not None:
        codes = f" (exit codes {r.exit_codes})" if r.exit_codes else ""  # a killed torchrun keeps none
        lines.append(f"  first failing rank: {r.failing_rank}{codes}")
    if r.error_text and r.error_text != r.error_line:
        lines.append("  " + r.error_text.replace("\n", "\n  ")[:4000])
    lines.extend(f"  {d}" for d in r.details)
    lines.append(f"  logs: {shown(r.log_dir, root)}")
    lines.append(f"  rerun: {rerun}")
    if compiled(r.axes, {"failure_class": r.failure_class}):
        lines.append(f"  which compiler step: {rerun} --simplefsdp-bisect=compiler")
    command = Path(r.log_dir or ".") / "command.txt"
    if r.log_dir and command.is_file():  # (every rank's environment and argv, this machine's paths: a file)
        lines.append(f"  the ranks' command: {shown(command, root)}")
    return "\n".join(lines)
