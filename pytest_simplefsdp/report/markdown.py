"""Step 7 for the tracking issue: the status markdown (--simplefsdp-status-md): per profile the status by feature,
then one grid per model, footnotes with the known failures' links."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from tabulate import tabulate

from .compare import MARKS, key
from .status import status_view_md
from .tables import (GRID_KEY, MUTATION_HEADERS, STATUS_MD, TRACE_NOTE, grid, mutation_rows, mutation_score,
                     where_line)


LEGEND = ("✅ passes · ❌ fails (new) · 🚧 known failure (xfail) · 🔁 known flaky · ⚠️ known failure that passed "
          "(XPASS: delete its entry) · ⏭️ skipped · ➖ n/a (ruled out) · 🆕 newly broken · 🎉 newly fixed · "
          "🔀 failure signature changed since the compared run · " + GRID_KEY)


def render_md(doc):
    """The status table people used to keep by hand: one grid per profile and model, footnotes."""
    out, notes = ["# SimpleFSDP composability status", "", LEGEND, ""], []
    changes = doc.get("comparison", {})
    for run in doc["runs"]:
        meta = run["meta"]
        versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
        tier = f", tier {meta['tier']}" if meta.get("tier") not in (None, "real") else ""
        if tier:
            out.extend([f"> {TRACE_NOTE}", ""])
        models = OrderedDict()
        for rec in run["cells"]:
            models.setdefault(rec["axes"].get("model", ""), []).append(rec)
        out.extend(status_view_md(run))
        for model, cells in models.items():
            out.append(f"## {model or meta.get('matrix', '?')} — profile {meta.get('profile', '?')}{tier}")
            out.append("")
            out.append(f"{meta.get('matrix', '?')}, target {meta.get('target', '?')}, {versions}, "
                       f"{meta.get('date', '')}{where_line(meta)}")
            out.append("")
            sub = model_grid(run, model)
            for rec in cells:
                symbol = "🔁" if rec.get("flaky") else STATUS_MD.get(rec["status"], rec["status"])
                mark = MARKS.get(changes.get(key(meta, rec), ""), "")
                note = _note(rec)
                if note:
                    notes.append(note)
                    symbol += f"[^{len(notes)}]"
                sub["cells"].append({**rec, "row": strip_model(rec["row"], model), "status": symbol + mark})
            headers, body = grid(sub, markdown=False, symbols=False)
            out.append(tabulate(body, headers=headers, tablefmt="github"))
            out.append("")
        if run.get("mutants"):
            out.extend([f"## mutation tier — profile {meta.get('profile', '?')}: {mutation_score(run)}", "",
                        tabulate(mutation_rows(run), headers=MUTATION_HEADERS, tablefmt="github"), ""])
    if notes:
        out.extend(f"[^{i}]: {note}" for i, note in enumerate(notes, 1))
        out.append("")
    if doc.get("walltime_plot"):
        out.extend([f"Wall time per cell: [{Path(doc['walltime_plot']).name}]({doc['walltime_plot']})", ""])
    return "\n".join(out)


def model_grid(run, model):
    """A run's grid input for one model's table (no cells yet): its dropped and valid places, rows without it."""
    return {"meta": run["meta"], "cells": [],
            "dropped": [dict(d, row=strip_model(d["row"], model)) for d in run["dropped"]
                        if d["axes"].get("model", "") == model],
            "valid": [dict(v, row=strip_model(v["row"], model)) for v in run["meta"].get("valid", [])
                      if v.get("model", "") == model]}


def strip_model(row, model):
    """The row label without the model (each model has its own table)."""
    if model and row.startswith(model):
        return row[len(model):].strip() or "-"
    return row


def _note(rec):
    if rec["status"] in ("xfailed", "skipped") and rec.get("known_failure"):
        return (f"`{rec['id']}`: known failure `{rec['known_failure']}` ({rec.get('known_failure_link')}): "
                f"{rec.get('error_line') or rec.get('verdict') or ''}")
    if rec["status"] == "failed" and not rec.get("failure_class"):  # a known failure the gate saw pass
        return f"`{rec['id']}`: {rec.get('verdict', '')}"
    if rec["status"] == "failed":
        plot = f" ([loss and grad-norm curves]({rec['plot']}))" if rec.get("plot") else ""
        return f"`{rec['id']}`: {rec.get('failure_class')}: {rec.get('error_line') or ''}{plot}"
    if rec["status"] == "xpassed":
        return f"`{rec['id']}`: {rec.get('verdict', '')}"
    return None
