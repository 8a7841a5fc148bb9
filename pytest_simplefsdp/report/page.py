"""Step 7, for a browser: a run as one static HTML page (``index.html``), readable from disk without a server.
The status by feature, then per profile and model the grid, each cell linking its log (the failing rank's
for a failure) and its details below: reproducer, every rank's log, plots, the compile trace's index."""

from __future__ import annotations

import html
import os
from collections import OrderedDict
from pathlib import Path

from tabulate import tabulate

from .compare import MARKS, key
from .markdown import LEGEND, model_grid, strip_model
from .status import features
from .tables import TRACE_NOTE, broken, grid, summary_counts, where_line

STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:80em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;font-size:90%}a{text-decoration:none}
.failed{background:#fdd}.xfailed{background:#ffe9c6}.passed{background:#e6f6e6}.xpassed{background:#f0e0ff}
code,pre{font-size:85%;white-space:pre-wrap}li{margin:.15em 0}"""
SYMBOLS = {"passed": "✅ pass", "failed": "❌ FAIL", "xfailed": "🚧 xfail", "xpassed": "⚠️ XPASS", "skipped": "⏭️ skip"}


def write(doc, folder: Path) -> Path:
    """Write ``folder/index.html`` for a run document (store.runs.load_run's shape); returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.html"
    path.write_text(render(doc, folder))
    return path


def render(doc, folder: Path) -> str:
    link = _linker(folder)
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>SimpleFSDP composability</title>",
           f"<style>{STYLE}</style></head><body><h1>SimpleFSDP composability status</h1>",
           f"<p>{html.escape(LEGEND)}</p>"]
    if doc.get("walltime_plot"):
        out.append(f"<p><a href='{link(doc['walltime_plot'])}'>wall time per cell (plot)</a></p>")
    changes = doc.get("comparison") or {}
    for run in doc["runs"]:
        meta = run["meta"]
        versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
        out.append(f"<h2>Profile {_e(meta.get('profile'))} — {_e(meta.get('matrix'))}</h2>")
        out.append(f"<p>target {_e(meta.get('target'))}, launcher {_e(meta.get('launcher'))}, tier "
                   f"{_e(meta.get('tier', 'real'))}, {_e(versions)}, {_e(meta.get('date', ''))}"
                   f"{_e(where_line(meta))}; {_e(summary_counts(run))}</p>")
        if meta.get("tier") == "trace":
            out.append(f"<p><b>{_e(TRACE_NOTE)}</b></p>")
        out.extend(_features(run))
        models = OrderedDict()
        for rec in run["cells"]:
            models.setdefault(rec["axes"].get("model", ""), []).append(rec)
        for model, cells in models.items():
            out.append(f"<h3>{_e(model or meta.get('matrix'))}</h3>")
            sub = {**model_grid(run, model),
                   "cells": [{**rec, "row": strip_model(rec["row"], model),
                              "status": _cell(rec, link, changes.get(key(meta, rec)))} for rec in cells]}
            headers, body = grid(sub, symbols=False)
            out.append(tabulate(body, headers=headers, tablefmt="unsafehtml"))
        out.append("<h3>Cells</h3><ul>")
        out.extend(_details(rec, link) for rec in run["cells"])
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _e(text):
    return html.escape(str(text if text is not None else ""))


def _linker(folder: Path):
    """A path as a link relative to the page (the page and the run folder can move together)."""
    base = Path(folder).resolve()

    def link(target):
        return html.escape(Path(os.path.relpath(Path(target).resolve(), base)).as_posix(), quote=True)
    return link


def main_log(rec):
    """The log a person opens first: the failing rank's, else rank 0's, else the cell's folder."""
    logs = rec.get("rank_logs") or {}
    rank = str(rec["failing_rank"]) if rec.get("failing_rank") is not None else "0"
    paths = logs.get(rank) or next(iter(logs.values()), None)
    return paths[0] if paths else (rec.get("log_dir") or None)


def _cell(rec, link, change):
    text = SYMBOLS.get(rec["status"], rec["status"])
    if rec.get("flaky"):
        text = "🔁 flaky"
    if rec.get("failure_class") and rec["status"] != "passed":
        text += f" {rec['failure_class']}"
    if rec.get("wall") and rec["status"] != "skipped":
        text += f" {rec['wall']:.0f}s"
    text = _e(text) + MARKS.get(change or "", "")
    log = main_log(rec)
    anchor = f"<a href='#cell-{_e(rec['id'])}' title='details'>ⓘ</a>"
    body = f"<a href='{link(log)}' title='log'>{text}</a>" if log else text
    return f"<span class='{_e(rec['status'])}'>{body}</span> {anchor}"


def _features(run):
    groups = features(run)
    if not groups:
        return []
    out = ["<h3>Status by feature</h3>"]
    for group, rows in groups:
        out.append(f"<p><b>{_e(group)}</b></p><ul>")
        for name, state, cells, entries in rows:
            passed = sum(1 for r in cells if broken(r) is False)
            links = ", ".join(f"<a href='{_e(link)}'>{_e(e)}</a>" for e, link in entries)
            out.append(f"<li>[{_e(state)}] {_e(name)}: {passed} of {len(cells)} cells pass"
                       f"{'; known failures: ' + links if links else ''}</li>")
        out.append("</ul>")
    return out


def _details(rec, link):
    parts = [f"<li id='cell-{_e(rec['id'])}'><b>{_e(rec['id'])}</b>: {_e(rec['status'])}"]
    if rec.get("error_line"):
        parts.append(f" — <code>{_e(rec['error_line'])}</code>")
    if rec.get("verdict"):
        parts.append(f"<br>{_e(rec['verdict'])}")
    if rec.get("known_failure_link"):
        parts.append(f" (<a href='{_e(rec['known_failure_link'])}'>{_e(rec.get('known_failure'))}</a>)")
    links = [f"<a href='{link(p)}'>rank {_e(r)}</a>" for r, paths in (rec.get("rank_logs") or {}).items()
             for p in paths[:1]]
    for label, field in (("result.json", "log_dir"), ("curves", "plot"), ("compile trace", "trace_html")):
        if rec.get(field):
            target = Path(rec[field]) / "result.json" if field == "log_dir" else rec[field]
            links.append(f"<a href='{link(target)}'>{label}</a>")
    if links:
        parts.append("<br>logs: " + " · ".join(links))
    if rec.get("plot"):
        parts.append(f"<br><img src='{link(rec['plot'])}' alt='curves' width='600'>")
    if rec.get("reproducer"):
        parts.append(f"<br>reproducer:<pre>{_e(rec['reproducer'])}</pre>")
    parts.append("</li>")
    return "".join(parts)
