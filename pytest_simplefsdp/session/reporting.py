"""The end of a matrix session: the terminal summary (the composability table, changes since a compared run,
leftovers), the report files (status markdown, JSON, HTML page, coverage), the known-failures update, and the
run's document for the ``pytest_simplefsdp_report`` hook. A dry run or plan prints what the run would do instead."""

from __future__ import annotations

import datetime
import json

from ..judge.results import CellResult
from ..judge.update import update_file
from ..kinds import KnownKind, RecordType, Status
from ..plots import walltime_plot
from ..report import coverage, page
from ..report.compare import change_lines, compare_runs
from ..report.markdown import render_md
from ..report.tables import render_text
from ..run import lookahead
from ..store.runs import WALLTIME_PLOT
from ..yamlio import MatrixError


class Reporter:
    def __init__(self, state):
        self.state, self.settings = state, state.settings
        self.selected = []  # (run, cell) of the collected items, in order
        self.progress = None
        self.leftover_lines, self.update_lines, self.update_path = [], [], None

    def summary(self, tr):
        s, state = self.settings, self.state
        if s.dry_run:
            lookahead.summary(state, self.selected, self.progress, tr)
            if s.coverage:
                self.coverage(tr)
            return
        doc = self.document()
        if state.compared is not None:
            doc["comparison"] = compare_runs(state.compared, doc)
            tr.section(f"simplefsdp: changes since {s.compare}")
            for line, good in change_lines(doc["comparison"]):
                tr.write_line(line, red=not good, green=good)
        if self.leftover_lines:
            tr.section("simplefsdp: processes outlived the run (killed now)", red=True)
            for line in self.leftover_lines:
                tr.write_line(line, red=True)
        tr.section("simplefsdp composability")
        for line in self.update_lines:
            tr.write_line(f"{self.update_path}: {line}")
        tr.write_line(render_text(doc))
        if state.store.jsonl is not None:
            tr.write_line(f"results: {state.store.path}")
        for run_doc in doc["runs"]:
            for seed in run_doc.get("seeds", []):
                tr.write_line(f"seed checkpoint {seed['model']}: "
                              + ("kept from an earlier run" if seed["kept_from_earlier_run"] else "made and kept")
                              + f" ({seed['folder']}; --simplefsdp-fresh makes it again)")
        self.write_files(tr, doc)
        if s.coverage:
            self.coverage(tr)
        state.config.hook.pytest_simplefsdp_report(config=state.config, doc=doc)

    def document(self):
        """The run as --simplefsdp-json writes it, with the seeds its cells started from and its overview plot."""
        state = self.state
        doc = state.store.document()
        for run, run_doc in zip(state.runs, doc["runs"]):  # the seed checkpoints the cells started from
            if state.book.seed_records.get(run.name):
                run_doc["seeds"] = state.book.seed_records[run.name]
        if state.store.records and (self.settings.html or self.settings.status_md):
            doc["walltime_plot"] = walltime_plot(state.run_dir.resolve() / WALLTIME_PLOT, doc)
        return doc

    def write_files(self, tr, doc):
        s = self.settings
        for path, text, what in ((s.status_md, lambda: render_md(doc), "status table"),
                                 (s.json, lambda: json.dumps(doc, indent=1) + "\n", "json report")):
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text())
                tr.write_line(f"{what}: {path}")
        if s.html:
            tr.write_line(f"html page: {page.write(doc, s.html)}")

    def coverage(self, tr):
        """--simplefsdp-coverage: the upstream suite's coverage by the shipped profiles, written and summed up."""
        path, known = self.settings.coverage, self.state.known
        try:
            cov = coverage.report(known.path if known else None)
        except (LookupError, MatrixError) as e:
            tr.write_line(f"simplefsdp coverage: not written: {e}", red=True)
            return
        fmt = {".md": "md", ".json": "json"}.get(path.suffix, "text")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(coverage.render(cov, fmt))
        tr.write_line(coverage.render(cov).splitlines()[0] + f" (report: {path})")

    def update_known_failures(self):
        """--simplefsdp-update-known-failures: new failures added, entries whose cells all passed removed."""
        state = self.state
        path = state.known.path if state.known else (self.settings.known_failures
                                                     or state.config.rootpath / "known_failures.yaml")
        runs = {run.name: run for run in state.runs}
        cells = [(runs[r["matrix"]], CellResult.from_record(r)) for r in state.store.records
                 if r["type"] == RecordType.CELL and not r.get("mutant")]
        new = [(run.matrix.profile, r) for run, r in cells if r.status == Status.FAILED and not r.known_failure
               and r.failure_class]
        outcomes = {}  # known-failure id -> [cell passed?] for the cells it applied to
        for run, r in cells:
            for e in state.entries_for(run, r):
                outcomes.setdefault(e.id, []).append(r.failure_class is None)
        xfails = {e.id for e in (state.known.entries if state.known else []) if e.kind == KnownKind.XFAIL}
        passing = {eid for eid, passed in outcomes.items() if all(passed) and eid in xfails}
        self.update_lines = update_file(path, new, passing, datetime.date.today().isoformat())
        self.update_path = path
