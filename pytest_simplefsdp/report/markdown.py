"""Step 7 for the tracking issue: the status markdown (--simplefsdp-status-md). Per profile: how many of its valid
cells ran, the status by feature, which combinations fail, then one grid per model with every valid cell (``·``
where it did not run), footnotes with the known failures' links. Text from a run is shown as code spans (it never
renders as markup), and every link is relative to the folder the file is written to, so the file can be pasted or
committed beside the run."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tabulate import tabulate

from ..kinds import Status
from ..words import plural
from . import gate
from .combos import failing_combinations
from .compare import MARKS, key
from .status import features
from .tables import (
    GRID_KEY,
    MUTATION_HEADERS,
    STATUS_MD,
    grid,
    mutation_rows,
    mutation_score,
    summary_counts,
    trace_note,
    where_line,
)

LEGEND = (
    "✅ passes · ❌ fails (new) · 🚧 known failure (xfail) · 🔁 after one of those: flaky (a known flaky cell, "
    "or a flaky cell's flip since the compared run) · ⚠️ known failure that passed (XPASS: delete its entry) · "
    "⏭️ skipped · ➖ n/a (ruled out) "
    "· 🆕 newly broken · 🎉 newly fixed · 🔀 failure signature changed since the compared run · " + GRID_KEY
)


def code(text) -> str:
    """Text that came from a run (a rank's error line, a verdict quoting it) as a markdown code span: shown as the
    characters it is wherever the file is rendered (markup, HTML and links in it stay text). One line; a fence one
    backtick longer than any run of backticks inside."""
    text = " ".join(str(text or "").split())
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def relative(target, base) -> str:
    """A path as a link relative to ``base`` (the folder the markdown is written to)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(base).resolve())).as_posix()


def render_md(doc, base=None):
    """The status people used to keep by hand; ``base``: the folder links are relative to (default: the cwd)."""
    base = base or Path.cwd()
    out, notes = ["# SimpleFSDP composability status", "", LEGEND, ""], []
    changes = doc.get("comparison") or {}
    if doc.get("compared_with") is not None:
        out.extend(comparison_md(doc, changes, base))
    for line in doc.get("incidents") or ():
        out.extend([f"> launcher incident: {code(line)}", ""])
    pr = gate.gate(doc)
    if pr:
        out.extend(gate.markdown(pr))
    for run in doc["runs"]:
        meta = run["meta"]
        if note := trace_note(meta):
            out.extend([f"> {note}", ""])
        out.extend(
            [
                f"## Profile {meta.get('profile', '?')} — {summary_counts(run)}",
                "",
                f"{meta.get('matrix', '?')}, target {meta.get('target', '?')}, "
                + ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
                + f", {meta.get('date', '')}{where_line(meta)}{known_failures_line(meta, base)}",
                "",
            ]
        )
        out.extend(status_md(run))
        out.extend(combinations_md(run))
        records = {(rec["axes"].get("model", "")): [] for rec in run["meta"].get("valid", [])}
        for rec in run["cells"]:
            records.setdefault(rec["axes"].get("model", ""), []).append(rec)
        models = [v.get("model", "") for v in run["meta"].get("valid", [])]
        for model, cells in records.items():
            ran = len(cells)
            valid = models.count(model) or ran
            out.append(f"### {model or meta.get('matrix', '?')}: {ran} of {plural(valid, 'valid cell')} run")
            out.append("")

            def symbol(rec, meta=meta):  # (a known flaky cell: its outcome, then the flaky mark)
                text = STATUS_MD.get(rec["status"], rec["status"]) + ("🔁" if rec.get("flaky") else "")
                note = _note(rec, base)
                if note:
                    notes.append(note)
                    text += f"[^{len(notes)}]"
                return text + MARKS.get(changes.get(key(meta, rec), ""), "")

            sub = model_grid(run, model, cells)

            def ruled_out(rec):  # one footnote per rule and reason, shared by its cells
                note = f"➖ ruled out by rule `{rec.get('rule', '?')}`: {code(rec.get('reason', ''))}"
                if note not in notes:
                    notes.append(note)
                return f"{STATUS_MD['dropped']}[^{notes.index(note) + 1}]"

            headers, body = grid(sub, cell=symbol, na=ruled_out, every_row=True)
            out.append(tabulate(body, headers=headers, tablefmt="github"))
            out.append("")
        if run.get("mutants"):
            out.extend(
                [
                    f"## mutation tier — profile {meta.get('profile', '?')}: {mutation_score(run)}",
                    "",
                    tabulate(mutation_rows(run), headers=MUTATION_HEADERS, tablefmt="github"),
                    "",
                ]
            )
    if notes:
        out.extend(f"[^{i}]: {note}" for i, note in enumerate(notes, 1))
        out.append("")
    if doc.get("walltime_plot"):
        out.extend(
            [f"Wall time per cell: [{Path(doc['walltime_plot']).name}]({relative(doc['walltime_plot'], base)})", ""]
        )
    return "\n".join(out)


def known_failures_line(meta, base):
    known = meta.get("known_failures")
    return f"; judged against `{relative(known['path'], base)}` (sha256 {known['sha256'][:12]})" if known else ""


def comparison_md(doc, changes, base):
    was = doc["compared_with"]
    was = relative(was, base) if os.path.isabs(str(was)) else was
    out = [f"**Changes since {code(was)}:** " + (plural(len(changes), "cell") if changes else "none"), ""]
    out.extend(f"- {MARKS.get(change, '')} {change}: `{k}`" for k, change in changes.items())
    return out + ([""] if changes else [])


def status_md(run):
    """The status by feature, in the tracking issue's shape: a checklist per group with the entries' links."""
    groups = features(run)
    if not groups:
        return []
    out = [
        "**Status by feature** (Done: every valid cell with it ran and passed; Partly run: some did not run in "
        "this run; In progress: the others fail as known failures; Failing: one fails with a new error)",
        "",
    ]
    for group, rows in groups:
        out.append(f"*{group}*")
        out.append("")
        for f in rows:
            links = "; known failures: " + ", ".join(f"[`{e}`]({link})" for e, link in f.entries) if f.entries else ""
            out.append(f"- [{f.state}] {f.name}: {f.counts()}{links}")
        out.append("")
    return out


def combinations_md(run):
    found = failing_combinations(run)
    if not found:
        return []
    out = [
        "**Which combination fails** (the axis values every cell failing with an error shares and no passing "
        "cell has):",
        "",
    ]
    for c in found:
        entry = f", known failure `{c.known}`" if c.known else ""
        what = c.label() if c.separated else f"{c.label()} (no passing cell tells them apart: what they share)"
        out.append(f"- {what}: {plural(len(c.cells), 'cell')}{entry}: {code(c.signature[:160])}")
    return out + [""]


def model_grid(run, model, cells=()):
    """A run's grid input for one model's table: its cells, dropped and valid places, rows without the model."""
    return {
        "meta": run["meta"],
        "cells": [dict(rec, row=strip_model(rec["row"], model)) for rec in cells],
        "dropped": [
            dict(d, row=strip_model(d["row"], model)) for d in run["dropped"] if d["axes"].get("model", "") == model
        ],
        "valid": [
            dict(v, row=strip_model(v["row"], model))
            for v in run["meta"].get("valid", [])
            if v.get("model", "") == model
        ],
    }


def strip_model(row, model):
    """The row label without the model (each model has its own table)."""
    if model and row.startswith(model):
        return row[len(model) :].strip() or "-"
    return row


def _note(rec, base):
    if rec["status"] in (Status.XFAILED, Status.SKIPPED) and rec.get("known_failure"):
        return (
            f"`{rec['id']}`: known failure `{rec['known_failure']}` ({rec.get('known_failure_link')}): "
            f"{code(rec.get('error_line') or rec.get('verdict'))}"
        )
    if rec["status"] == Status.FAILED and not rec.get("failure_class"):  # a known failure the gate saw pass
        return f"`{rec['id']}`: {code(rec.get('verdict'))}"
    if rec["status"] == Status.FAILED:
        plot = f" ([loss and grad-norm curves]({relative(rec['plot'], base)}))" if rec.get("plot") else ""
        return f"`{rec['id']}`: {rec.get('failure_class')}: {code(rec.get('error_line'))}{plot}"
    if rec["status"] == Status.XPASSED:
        return f"`{rec['id']}`: {code(rec.get('verdict'))}"
    return None
