"""--simplefsdp-sentinel=FOLDER: the nightly run on torchtitan main, unattended. FOLDER keeps the last nightly's
state (``nightly.json``: per cell its outcome, the versions it last passed on, the signatures reported since). After
the run, each cell that fails as new (confirmed by --simplefsdp-confirm, so not flaky tonight) and passed on some
earlier nightly is bisected over what changed since it last passed, whatever the nights between said: torchtitan's
commits of the checkout, then torch's releases where torch moved too. A window can hold two regressions: a probe
that fails otherwise is searched for in turn. Per bug (one signature of one profile) one issue body and one
known-failures entry are written into ``FOLDER/<time>/``; the state moves on.
Nothing is asked between: one command, the nightly's cron line."""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import replace
from pathlib import Path

from ..judge.known import load_known_failures
from ..judge.results import CellResult
from ..judge.update import drafts, update_file
from ..kinds import RecordType, Status
from ..spec.cells import cell_id
from ..versions.sets import INSTALLED, cell_set
from ..yamlio import MatrixError
from .bisecting import Bisector, installed_releases, window_of, window_words
from .compiling import PACKAGE, CompilerBisector, compiled

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
        """[(run, cell, record, last green versions)]: cells that fail now, new (no known-failures entry, not flaky
        tonight), and passed on some earlier nightly, whatever the nights between said (flaky, infra, skipped, or
        red with a bug already reported); a signature already reported for the cell since it last passed is not
        searched again."""
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
            reported = rec.get("signature") in before.get("reported", [])
            if new and not rec.get("flaky") and before.get("green") and not reported:
                out.append((run, cell, rec, before["green"]))
        return out

    def windows(self, green: dict, now: dict) -> list[tuple[str, str]]:
        """[(package, versions to bisect over)] between the versions a cell last passed on and tonight's, in order:
        torchtitan's commits (or releases) first, then torch's releases (with torchtitan as it last passed)."""
        out = []
        if green.get("torchtitan_commit") and now.get("torchtitan_commit"):
            if green["torchtitan_commit"] != now["torchtitan_commit"]:
                out.append(("torchtitan", f"{green['torchtitan_commit']}..{now['torchtitan_commit']}"))
        elif green.get("torchtitan") and now.get("torchtitan") and green["torchtitan"] != now["torchtitan"]:
            out.append(("torchtitan", f"{green['torchtitan']},{now['torchtitan']}"))
        if green.get("torch") and now.get("torch") and green["torch"] != now["torch"]:
            out.append(("torch", f"{green['torch']},{now['torch']}"))
        return out

    def run(self, records, selected) -> list:
        """Bisect the cells that turned red, over each package that moved since they last passed (grouped by the
        window they share); their Found records. Where torch moved too, its search runs with torchtitan pinned to
        the commit the cell last passed on, so that each package is searched with only itself moving."""
        self.red = self.turned_red(records, selected)
        groups = {}
        for run, cell, _rec, green in self.red:
            moved = self.windows(green, self.current(run, cell))
            for n, window in enumerate(moved):
                pinned = cell
                if n and moved[0][0] == "torchtitan" and green.get("torchtitan_commit"):
                    vset = cell_set(cell.axes).with_pin("torchtitan", "@" + green["torchtitan_commit"])
                    pinned = replace(cell, axes={**cell.axes, "versions": vset.label()})
                groups.setdefault((window, pinned is not cell), []).append((run, pinned))
        found = []
        for (window, pinned), pairs in groups.items():
            # (a pinned cell is not tonight's run: tonight's record is no probe of its versions)
            found += Bisector(self.state, *window, reuse=not pinned).run(records, pairs)
        # a compiled cell's failure: which compiler step breaks it, on tonight's versions
        tonight = [(run, cell) for run, cell, rec, _ in self.red if compiled(cell.axes, rec)]
        if tonight:
            found += CompilerBisector(self.state, Bisector(self.state)).run(records, tonight)
        return found

    def write(self, records, selected, found) -> list:
        """FOLDER/<time>/: the run document, one issue body and one known-failures entry per bug; then the state.
        Returns the lines the terminal shows."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = self.folder / stamp
        (self.out / "issues").mkdir(parents=True, exist_ok=True)
        (self.out / "run.json").write_text(json.dumps(self.state.store.document(), indent=1) + "\n")
        bisected = {}  # (matrix, cell id, signature) -> the searches that found its window (torchtitan's first)
        steps = {(f.run.name, f.cell.id): f for f in found if f.package == PACKAGE and f.named}
        for f in found:
            if f.package != PACKAGE:
                bisected.setdefault((f.run.name, f.cell.id, f.signature or f.record.get("signature")), []).append(f)
        runs = {run.name: run for run, _ in selected}
        bugs = []  # one per signature and profile: update.drafts groups them as the update command does
        for run in dict.fromkeys(r for r, *_ in self.red):
            failing = [CellResult.from_record(rec) for r, _, rec, _ in self.red if r is run]
            # a second regression a search met in the window (its probes failed otherwise): a bug of its own
            failing += [
                replace(f.failing, id=f.cell.id, axes=f.cell.axes, signature=f.signature)
                for f in found
                if f.run is run and f.signature and f.failing is not None and f.bisection.window
            ]
            bugs += [(run, d) for d in drafts(run.matrix.profile, failing, self.passing_axes(records, run))]
        windows, lines = {}, []
        for n, (run, draft) in enumerate(bugs, 1):
            searches = [f for r in draft.results for f in bisected.get((run.name, r.id, r.signature), [])]
            found_one = next((f for f in searches if f.bisection and f.bisection.window), None) or next(
                iter(searches), None
            )
            path = self.out / "issues" / f"{n}-{slug(draft.id)}.md"
            step = next((steps[(run.name, r.id)] for r in draft.results if (run.name, r.id) in steps), None)
            path.write_text(issue_body(run, draft, found_one, self.state.settings.torchtitan_repo, step))
            if found_one is not None and window_of(found_one):
                windows[draft.id] = window_of(found_one)
            where = (
                window_words(found_one, self.state.settings.torchtitan_repo)
                if found_one
                else "no window: it last passed on the same versions"
            )
            where += f"; compiler step: {step.named}" if step else ""
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
            before = cells.get(k) or {}
            green = self.current(run, cell) if passed else before.get("green")
            reported = [] if passed else list(before.get("reported", []))
            if any(r is run and c.id == cell.id for r, c, *_ in self.red):
                reported.append(rec.get("signature"))  # reported tonight: not searched again until it passes
            cells[k] = {"status": str(rec["status"]), "green": green, "reported": reported}
        state = {"at": datetime.datetime.now().isoformat(timespec="seconds"), "run": str(self.out), "cells": cells}
        (self.folder / STATE).write_text(json.dumps(state, indent=1) + "\n")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:80]


def issue_body(run, draft, found, repo, step=None) -> str:
    """One bug's issue body: its cells, its signature, and (where bisected) the bisection's own body: window,
    probes, portable reproducer and the failing rank's log; where a compiled cell's failure was bisected inside
    tonight's versions (``step``), the compiler step and that bisection's probes at the end."""
    cells = "\n".join(f"- `{run.matrix.profile}::{r.id}`: {r.error_line}" for r in draft.results)
    head = [
        f"# {draft.results[0].error_line} (nightly: {len(draft.results)} cell(s) turned red)",
        "",
        f"**Signature:** `{draft.results[0].signature}`",
        *([f"**Compiler step:** {step.named}"] if step else []),
        "",
        "## Cells",
        "",
        cells,
        "",
    ]
    tail = ["", f"## Compiler bisection of `{step.cell.id}`", "", Path(step.issue).read_text()] if step else []
    if found is None or found.issue is None:
        return "\n".join(
            head
            + [
                "No window: the cells last passed on the same versions, or could not be bisected"
                + (f" ({found.error})" if found is not None and found.error else "")
                + ".",
                "",
            ]
            + tail
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
        + tail
    )
