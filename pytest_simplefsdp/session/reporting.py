"""The end of a matrix session: the terminal summary (the composability table, changes since a compared run,
leftovers), the report files (status markdown, JSON, HTML page, coverage), the known-failures update, and the
run's document for the ``pytest_simplefsdp_report`` hook. A dry run or plan prints what the run would do instead."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from tabulate import tabulate

from ..judge.known import load_known_failures
from ..judge.results import CellResult
from ..judge.update import drafts, update_file
from ..kinds import KnownKind, RecordType, Status
from ..machine import versions
from ..paths import KNOWN_FAILURES, PACKAGE, shown
from ..plots import walltime_plot
from ..report import coverage, document, gate, page
from ..report.compare import change_lines
from ..report.markdown import render_md
from ..report.tables import broken, render_text
from ..report.twin import rows as twin_rows
from ..report.twin import summary as twin_summary
from ..report.twin import twins
from ..run import lookahead
from ..store.runs import WALLTIME_PLOT
from ..versions.bisect import table as bisect_table
from ..versions.sets import INSTALLED
from ..words import release
from ..yamlio import MatrixError
from .bisecting import bisect_record, window_of, window_words


class Reporter:
    def __init__(self, state, verbose=False):
        self.state, self.settings, self.verbose = state, state.settings, verbose
        self.root = state.config.rootpath  # (report paths are shown relative to it, as pytest shows test files)
        self.selected = []  # (run, cell) of the collected items, in order
        self.progress = None
        self.incidents, self.leftover_lines, self.update_lines, self.update_path = [], [], [], None
        self.bisections = []  # session.bisecting.Found of --simplefsdp-bisect (or of the sentinel)
        self.sentinel_lines = []  # --simplefsdp-sentinel: what it found and wrote

    def summary(self, tr):
        s, state = self.settings, self.state
        if s.dry_run:
            lookahead.summary(state, self.selected, self.progress, tr, self.verbose)
            return
        if state.config.option.collectonly:  # no run: no report is written, no stored run is touched
            return
        doc = self.document()
        if "comparison" in doc:
            tr.section(f"simplefsdp: changes since {doc['compared_with']}")
            for line, good in change_lines(doc["comparison"]):
                tr.write_line(line, red=not good, green=good)
        if self.incidents:
            tr.section("simplefsdp: launcher incidents", red=True)
            for line in self.incidents:
                tr.write_line(line, red=True)
        if self.leftover_lines:
            tr.section("simplefsdp: processes outlived the run (killed now)", red=True)
            for line in self.leftover_lines:
                tr.write_line(line, red=True)
        for run_doc in doc["runs"]:
            not_gated = (run_doc["meta"].get("changed") or {}).get("not_gated")
            if not_gated:
                tr.section(f"simplefsdp: not gated here ({run_doc['meta'].get('matrix')}): not a pass", red=True)
                for path, why in not_gated.items():
                    tr.write_line(f"{path}: {why}", red=True)
        tr.section("simplefsdp composability")
        for line in self.update_lines:
            tr.write_line(f"{shown(self.update_path, self.root)}: {line}")
        tr.write_line(render_text(doc, self.verbose, self.root))
        self.gate_section(tr, doc)
        self.twin_section(tr, doc)
        self.bisect_section(tr)
        if self.sentinel_lines:
            tr.section("simplefsdp sentinel")
            for line in self.sentinel_lines:
                tr.write_line(line)
        if state.store.jsonl is not None:
            tr.write_line(f"results: {shown(state.store.path, self.root)}")
        for run_doc in doc["runs"]:
            for seed in run_doc.get("seeds", []):
                tr.write_line(
                    f"seed checkpoint {seed['model']}: "
                    + ("kept from an earlier run" if seed["kept_from_earlier_run"] else "made and kept")
                    + f" ({shown(seed['folder'], self.root)}; --simplefsdp-fresh makes it again)"
                )
        self.write_files(tr, doc)
        if s.coverage:
            self.coverage(tr)
        state.config.hook.pytest_simplefsdp_report(config=state.config, doc=doc)

    def document(self):
        """The run's document (report.document), with the seeds its cells started from and its overview plot."""
        state, twin = self.state, self.settings.twin
        installed = f"installed ({', '.join(f'{k} {v}' for k, v in versions().items() if k != 'python')})"
        found = [bisect_record(f, self.settings.torchtitan_repo) for f in self.bisections]
        doc = document.complete(
            state.store.document(),
            seeds=state.book.seed_records,
            incidents=self.incidents,
            compared=state.compared,
            twin=twin,
            installed=installed if twin else "",
            bisections=found or None,
        )
        if state.store.records and (self.settings.html or self.settings.status_md):
            doc["walltime_plot"] = walltime_plot(state.run_dir.resolve() / WALLTIME_PLOT, doc)
        return doc

    @staticmethod
    def gate_section(tr, doc):
        """--simplefsdp-base: every failure as new, broken trunk, flaky or known, with both sides' signatures."""
        pr = doc.get("gate")
        if pr is None:
            return
        tr.section(f"simplefsdp {gate.headline(pr)}", red=gate.shut(pr["counts"]), green=not gate.shut(pr["counts"]))
        if pr["failures"]:
            tr.write_line(
                tabulate(gate.rows(pr), headers=("cell", "class", "signature here", "on the base"), tablefmt="simple")
            )
        tr.write_line(gate.legend())
        for line in gate.numerics_lines(pr):
            tr.write_line(line)

    @staticmethod
    def twin_section(tr, doc):
        """--simplefsdp-twin: the cells whose verdict, signature or numerics differ between the two version sets."""
        for block, run_doc in zip(doc.get("twin", []), doc["runs"]):
            first, second = block["first"], block["second"]
            pairs = twins(run_doc, INSTALLED, second)
            tr.section(f"simplefsdp twin: {block['profile']}, {twin_summary(pairs, first, second)}")
            rows = twin_rows(pairs, first, second)
            if rows:
                tr.write_line(
                    tabulate(rows, headers=("cell", "installed", second, "numerics", "what differs"), tablefmt="simple")
                )
            walls = [(p["cell"], *p["walls"]) for p in block["pairs"]]
            tr.write_line("walls (s): " + ", ".join(f"{c} {a:.0f}/{b:.0f}" for c, a, b in walls if a and b))

    def bisect_section(self, tr):
        for found in self.bisections:
            cell = f"{found.run.matrix.profile}::{found.cell.id}"
            if found.error:
                tr.section(f"simplefsdp bisect: {cell}", red=True)
                tr.write_line(found.error)
                continue
            b = found.bisection
            second = f" (another regression in its window: {found.signature})" if found.signature else ""
            tr.section(
                f"simplefsdp bisect {found.package}: {cell}{second}: "
                f"{window_words(found, self.settings.torchtitan_repo)}"
            )
            what = "step" if found.named else "version"
            tr.write_line(
                tabulate(
                    bisect_table(b),
                    headers=(what, "outcome", "runs", "signature or line", "wall"),
                    tablefmt="simple",
                )
            )
            if found.named:  # (a compiler bisection: its probes are the steps it tried)
                inside = f"; its ranks failed inside {found.running}" if found.running else ""
                tr.write_line(
                    f"{len(b.probes)} probe{'' if len(b.probes) == 1 else 's'} in {found.wall:.0f}s; the failing "
                    "run's graph passes: "
                    f"{', '.join(found.passes) or 'none recorded'}{inside}; issue body: {found.issue}"
                )
                continue
            tr.write_line(f"{len(b.probes)} versions probed of {len(b.versions)}; issue body: {found.issue}")

    def write_files(self, tr, doc):
        s = self.settings
        for path, text, what in (
            (s.status_md, lambda: render_md(doc, s.status_md.parent), "status markdown"),
            (s.json, lambda: json.dumps(doc, indent=1) + "\n", "json report"),
        ):
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text())
                tr.write_line(f"{what}: {shown(path, self.root)}")
        # the page is written by default beside the run's records (a run that stored nothing has no page)
        html = s.html or (self.state.run_dir if self.state.store.jsonl is not None else None)
        if html:
            elsewhere = "" if s.html else " (--simplefsdp-html=PATH writes it elsewhere; with the wall-time plot)"
            tr.write_line(f"html page: {shown(page.write(doc, html), self.root)}{elsewhere}")

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

    def windows(self) -> dict:
        """Entry id -> the window a bisection or a twin run found: the cell's known failure, else its new entry."""
        out = {}
        for found in self.bisections:
            window = window_of(found)
            if window and not found.signature:  # (a second regression met in the window is not this cell's entry)
                out[found.record.get("known_failure") or f"{found.run.matrix.profile}-{found.cell.id}"] = window
        twin = self.settings.twin
        if twin:
            for run in self.state.runs:
                doc = {
                    "cells": [
                        r for r in self.state.store.records if r["matrix"] == run.name and r["type"] == RecordType.CELL
                    ]
                }
                for t in twins(doc, INSTALLED, twin):
                    if broken(t.a) is False and broken(t.b):  # passes on the installed versions, fails on the twin
                        # a window names releases
                        ran = {p: release(t.b.get("versions", {}).get(p)) or None for p in ("torch", "torchtitan")}
                        was = {p: release(t.a.get("versions", {}).get(p)) or None for p in ("torch", "torchtitan")}
                        changed = {p: v for p, v in ran.items() if v and v != was.get(p)}
                        if changed:
                            eid = t.b.get("known_failure") or f"{run.matrix.profile}-{t.b['id']}"
                            out[eid] = {"first_failing": changed, "last_passing": {p: was[p] for p in changed}}
        return out

    def reasons(self) -> dict:
        """Entry id -> the compiler step a compiler bisection named for its cell (the cell's known failure, else its
        new entry), said as the end of the entry's reason."""
        today, out = datetime.date.today().isoformat(), {}
        # of an entry's cells, the one whose search named the most (a pass, then a rung) speaks for it
        named = sorted((f for f in self.bisections if f.named), key=lambda f: (bool(f.culprits), "already" in f.named))
        for f in named:
            words = f"Compiler bisection ({today}, {f.cell.id}, {len(f.bisection.probes)} probes): {f.named}."
            out[f.record.get("known_failure") or f"{f.run.matrix.profile}-{f.cell.id}"] = words
        return out

    def update_known_failures(self):
        """--simplefsdp-update-known-failures: new failures added, entries whose cells all passed removed. The file
        that judged the run is updated; the shipped one never is (it lies in the installed package): the update goes
        to the rootdir's known_failures.yaml, made from the shipped file's text."""
        state = self.state
        path = (
            state.known.path
            if state.known
            else (self.settings.known_failures or state.config.rootpath / "known_failures.yaml")
        )
        if Path(path).resolve() == KNOWN_FAILURES.resolve() and KNOWN_FAILURES.resolve().is_relative_to(PACKAGE):
            path = state.config.rootpath / "known_failures.yaml"
            path.write_text(KNOWN_FAILURES.read_text())
        runs = {run.name: run for run in state.runs}
        cells = [
            (runs[r["matrix"]], CellResult.from_record(r))
            for r in state.store.records
            if r["type"] == RecordType.CELL and not r.get("mutant")
        ]
        # (a cell that never ran, or that its baseline or seed checkpoint failed, has no failure of its own to record)
        new = []  # one draft per signature and profile, with the values no passing cell of the profile has
        for run in runs.values():
            mine = [r for m, r in cells if m is run and not r.not_run and not r.culprit]
            failing = [r for r in mine if r.status == Status.FAILED and not r.known_failure and r.failure_class]
            passing = [r.axes for r in mine if r.failure_class is None and r.status != Status.SKIPPED]
            new.extend(drafts(run.matrix.profile, failing, passing) if failing else [])
        outcomes = {}  # known-failure id -> [cell passed?] for the cells it applied to
        for run, r in cells:
            for e in state.entries_for(run, r):
                outcomes.setdefault(e.id, []).append(r.failure_class is None)
        xfails = {e.id for e in (state.known.entries if state.known else []) if e.kind == KnownKind.XFAIL}
        passing = {eid for eid, passed in outcomes.items() if all(passed) and eid in xfails}
        try:
            self.update_lines = update_file(
                path,
                new,
                passing,
                datetime.date.today().isoformat(),
                check=lambda written: load_known_failures(written, None),
                windows=self.windows(),
                reasons=self.reasons(),
            )
        except (MatrixError, ValueError) as e:  # the old file stays as it was
            self.update_lines = [f"not updated: the new text would not load: {e}"]
        self.update_path = path
