"""--simplefsdp-sentinel=FOLDER: the nightly run on torchtitan main, unattended. FOLDER keeps the last nightly's
state (``nightly.json``: per cell its outcome and the versions it last passed on). After the run, each cell that
passed last night and now fails as new (confirmed by --simplefsdp-confirm, so not flaky) is bisected over what
changed since it last passed (torchtitan commits of the checkout, else torch releases), and per bug (one signature
of one profile) one issue body and one known-failures entry are written into ``FOLDER/<time>/``; the state moves on.
Nothing is asked between: one command, the nightly's cron line."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from ..judge.known import load_known_failures
from ..judge.results import CellResult
from ..judge.update import drafts, update_file
from ..kinds import RecordType, Status
from ..spec.cells import cell_id
from ..versions.sets import INSTALLED
from ..yamlio import MatrixError
from .bisecting import Bisector, installed_releases, window_of, window_words

STATE = "nightly.json"


def key(run, cell) -> str:
    """A cell's name across nightlies: its profile and id on the installed versions (a nightly that pins
    torchtitan@<commit> names the same cell every night)."""
    return f"{run.matrix.profile}::{cell_id(run.matrix, {**cell.axes, 'versions': INSTALLED})}"


class Sentinel:
    def __init__(self, state, folder: Path):
        self.state, self.folder = state, Path(folder)
        path = self.folder / STATE
        self.last = json.loads(path.read_text()) if path.is_file() else None  # None: the first nightly
        self.out = None  # FOLDER/<time>/ once written
        self.red, self.lines = [], []

    def current(self, run, cell) -> dict:
        """The versions a cell ran on tonight: torch and torchtitan releases, and the torchtitan commit."""
        commit = run.commit_of(cell.axes)
        return {**installed_releases(), "torchtitan_commit": commit.sha if commit else None}

    def turned_red(self, records, selected) -> list:
        """[(run, cell, record, last green versions)]: cells that passed in the last nightly and fail now, new
        (no known-failures entry, not flaky)."""
        if not self.last:
            return []
        cells = self.last.get("cells", {})
        by_key = {(r.name, c.id): (r, c) for r, c in selected}
        out = []
        for rec in records:
            if rec["type"] != RecordType.CELL or rec.get("mutant") or (rec["matrix"], rec["id"]) not in by_key:
                continue
            run, cell = by_key[(rec["matrix"], rec["id"])]
            before = cells.get(key(run, cell)) or {}
            new = rec["status"] == Status.FAILED and rec.get("failure_class") and not rec.get("known_failure")
            if new and not rec.get("flaky") and before.get("status") == Status.PASSED:
                out.append((run, cell, rec, before.get("green") or {}))
        return out

    def window(self, green: dict, now: dict) -> tuple[str, str] | None:
        """(package, versions to bisect over) between the versions a cell last passed on and tonight's."""
        if (
            green.get("torchtitan_commit")
            and now.get("torchtitan_commit")
            and green["torchtitan_commit"] != now["torchtitan_commit"]
        ):
            return "torchtitan", f"{green['torchtitan_commit']}..{now['torchtitan_commit']}"
        for package in ("torch", "torchtitan"):
            if green.get(package) and now.get(package) and green[package] != now[package]:
                return package, f"{green[package]},{now[package]}"
        return None

    def run(self, records, selected) -> list:
        """Bisect the cells that turned red (grouped by the window they share); their Found records."""
        self.red = self.turned_red(records, selected)
        groups = {}
        for run, cell, _rec, green in self.red:
            groups.setdefault(self.window(green, self.current(run, cell)), []).append((run, cell))
        found = []
        for window, pairs in groups.items():
            if window is None:
                continue  # nothing changed since it passed: its confirmed failure has no window to search
            found += Bisector(self.state, *window).run(records, pairs)
        return found

    def write(self, records, selected, found) -> list:
        """FOLDER/<time>/: the run document, one issue body and one known-failures entry per bug; then the state.
        Returns the lines the terminal shows."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = self.folder / stamp
        (self.out / "issues").mkdir(parents=True, exist_ok=True)
        (self.out / "run.json").write_text(json.dumps(self.state.store.document(), indent=1) + "\n")
        bisected = {(f.run.name, f.cell.id): f for f in found}
        runs = {run.name: run for run, _ in selected}
        bugs = []  # one per signature and profile: update.drafts groups them as the update command does
        for run in dict.fromkeys(r for r, *_ in self.red):
            failing = [CellResult.from_record(rec) for r, _, rec, _ in self.red if r is run]
            bugs += [(run, d) for d in drafts(run.matrix.profile, failing, self.passing_axes(records, run))]
        windows, lines = {}, []
        for n, (run, draft) in enumerate(bugs, 1):
            found_one = next((bisected[(run.name, r.id)] for r in draft.results if (run.name, r.id) in bisected), None)
            path = self.out / "issues" / f"{n}-{slug(draft.id)}.md"
            path.write_text(issue_body(run, draft, found_one, self.state.settings.torchtitan_repo))
            if found_one is not None and window_of(found_one):
                windows[draft.id] = window_of(found_one)
            where = (
                window_words(found_one, self.state.settings.torchtitan_repo)
                if found_one
                else "no window: it last passed on the same versions"
            )
            lines.append(
                f"bug {n}: {len(draft.results)} cell(s), {draft.results[0].signature}: {where}; issue body {path}"
            )
        draft_file = self.out / "known_failures.draft.yaml"
        if bugs:
            draft_file.write_text(
                "# drafts from the nightly sentinel: review, fill in the links, move into known_failures.yaml\n"
            )
            try:
                update_file(
                    draft_file,
                    [d for _, d in bugs],
                    [],
                    datetime.date.today().isoformat(),
                    check=lambda written: load_known_failures(written, None),
                    windows=windows,
                )
            except (MatrixError, ValueError) as e:
                lines.append(f"known-failures drafts not written: {e}")
        self.save(records, runs)
        head = (
            f"{len(self.red)} cell(s) turned red since the last nightly ({self.last.get('at')}), {len(bugs)} bug(s)"
            if self.last
            else "the first nightly here: its outcomes are the state to compare the next one with"
        )
        return [head, *lines, f"written: {self.out}"]

    @staticmethod
    def passing_axes(records, run) -> list:
        return [
            r["axes"]
            for r in records
            if r["type"] == RecordType.CELL
            and r["matrix"] == run.name
            and not r.get("mutant")
            and r["status"] == Status.PASSED
        ]

    def save(self, records, runs):
        """The state the next nightly compares with: each cell's outcome, and the versions it last passed on."""
        cells = dict((self.last or {}).get("cells", {}))
        for rec in records:
            if rec["type"] != RecordType.CELL or rec.get("mutant") or rec["matrix"] not in runs:
                continue
            run = runs[rec["matrix"]]
            cell = run.cell(rec["id"])
            if cell is None:
                continue
            k = key(run, cell)
            passed = rec["status"] == Status.PASSED
            green = self.current(run, cell) if passed else (cells.get(k) or {}).get("green")
            cells[k] = {"status": str(rec["status"]), "green": green}
        state = {"at": datetime.datetime.now().isoformat(timespec="seconds"), "run": str(self.out), "cells": cells}
        (self.folder / STATE).write_text(json.dumps(state, indent=1) + "\n")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:80]


def issue_body(run, draft, found, repo) -> str:
    """One bug's issue body: its cells, its signature, and (where bisected) the bisection's own body: window,
    probes, portable reproducer and the failing rank's log."""
    cells = "\n".join(f"- `{run.matrix.profile}::{r.id}`: {r.error_line}" for r in draft.results)
    head = [
        f"# {draft.results[0].error_line} (nightly: {len(draft.results)} cell(s) turned red)",
        "",
        f"**Signature:** `{draft.results[0].signature}`",
        "",
        "## Cells",
        "",
        cells,
        "",
    ]
    if found is None or found.issue is None:
        return "\n".join(
            head
            + [
                "No window: the cells last passed on the same versions, or could not be bisected"
                + (f" ({found.error})" if found is not None and found.error else "")
                + ".",
                "",
            ]
        )
    return "\n".join(
        head
        + [
            f"**Window:** {window_words(found, repo)}",
            "",
            f"## Bisection of `{found.cell.id}`",
            "",
            Path(found.issue).read_text(),
        ]
    )
