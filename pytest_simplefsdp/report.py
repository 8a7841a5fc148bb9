"""Step 7: the composability table and the stored run, rendered from results alone.

A run is stored as JSON lines (one ``meta`` line per matrix, then one ``cell`` or ``dropped``
line each), flushed as cells finish, so a killed run keeps what it finished. The same table can
be rendered later from that file or from the ``--simplefsdp-json`` document:

    python -m pytest_simplefsdp.report RUN.json[l] [--format text|md|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, OrderedDict

from tabulate import tabulate

from . import schema

SYMBOLS = {"passed": "pass", "failed": "FAIL", "xfailed": "xfail", "xpassed": "XPASS", "skipped": "skip",
           "dropped": "n/a"}


def load_run(path):
    """Read a run from a JSON document or JSON lines; returns {"runs": [{meta, cells, dropped, baselines}]}.
    Every record is checked against the stored format (schema.py): a bad one is a SystemExit naming the
    file, the record (its line in JSON lines) and the field."""
    with open(path) as f:
        text = f.read()
    if not text.strip():
        raise SystemExit(f"{path}: empty: no run recorded")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        doc = None
        try:
            json.loads(text.strip().splitlines()[0])  # JSON lines: each line a record of its own
        except json.JSONDecodeError:
            raise SystemExit(f"{path}:{e.lineno}: not valid JSON (cut short?): {e.msg}") from None
    if isinstance(doc, dict) and "type" not in doc:
        try:
            return {k: v for k, v in schema.to_plain(schema.RunDoc.model_validate(doc)).items() if v is not None}
        except schema.ValidationError as e:
            raise SystemExit(f"{path}: not a simplefsdp run: {schema.problem(e)}") from None
    return _load_lines(path, text)


def _load_lines(path, text):
    runs = OrderedDict()
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                break  # a line cut short by a killed run: keep the rest
            raise SystemExit(f"{path}:{n}: not a JSON record: {e.msg}") from None
        kind = rec.pop("type", "cell") if isinstance(rec, dict) else None
        if kind not in schema.LINE_KINDS:
            raise SystemExit(f"{path}:{n}: not a simplefsdp record (type {kind!r}; known: "
                             f"{', '.join(schema.LINE_KINDS)})")
        try:
            rec = schema.to_plain(schema.LINE_KINDS[kind].model_validate(rec))
        except schema.ValidationError as e:
            raise SystemExit(f"{path}:{n}: {kind} record: {schema.problem(e)}") from None
        run = runs.setdefault(rec.get("matrix"), {"meta": None, "cells": [], "dropped": [], "baselines": []})
        if kind == "meta":
            run["meta"] = rec
        else:
            run["baselines" if kind == "baseline" else "dropped" if kind == "dropped" else "cells"].append(rec)
    missing = [name for name, run in runs.items() if run["meta"] is None]
    if missing:
        raise SystemExit(f"{path}: records of {', '.join(map(str, missing))} come without its meta record")
    if not runs:
        raise SystemExit(f"{path}: no run recorded")
    return {"runs": list(runs.values())}


def cell_text(rec, markdown=False):
    status = rec.get("status", "dropped")
    text = SYMBOLS.get(status, status)
    if rec.get("flaky"):
        text = "flaky " + ("pass" if status == "passed" else "fail")
    if status == "failed" and rec.get("failure_class"):
        text += f" {rec['failure_class']}"
    if rec.get("numerics") and status == "passed":
        text += " ≡" if rec["numerics"]["max_abs_diff"] == 0 else " ≈"
    if rec.get("wall") and status not in ("dropped", "skipped"):
        text += f" {rec['wall']:.0f}s"
    if markdown and status == "failed":
        text = f"**{text}**"
    return text


def grid(run, markdown=False, symbols=True):
    """(headers, rows) of one matrix: rows are layouts, columns compile × memory policy.

    ``symbols=False``: the records' ``status`` is already the text to show."""
    cells = run["cells"]
    rows, cols = OrderedDict(), OrderedDict()
    for rec in cells:  # only rows and columns with at least one run cell are shown
        rows.setdefault(rec["row"], {})
        cols.setdefault(rec["column"], None)
    order = {c: i for i, c in enumerate(run.get("meta", {}).get("columns", []))}  # the matrix's column order
    cols = OrderedDict((c, None) for c in sorted(cols, key=lambda c: order.get(c, len(order))))
    for rec in run["dropped"]:
        if rec["row"] in rows and rec["column"] in cols:
            rows[rec["row"]].setdefault(rec["column"], "n/a" if symbols else STATUS_MD["dropped"])
    for rec in cells:
        rows[rec["row"]][rec["column"]] = cell_text(rec, markdown) if symbols else rec["status"]
    headers = ["layout", *cols]
    body = [[row, *(entries.get(c, "") for c in cols)] for row, entries in rows.items()]
    return headers, body


def footnotes(run):
    lines = []
    for rec in run["cells"]:
        if rec.get("status") in ("failed", "xfailed", "xpassed"):
            rank = f", rank {rec['failing_rank']}" if rec.get("failing_rank") is not None else ""
            cls = f" {rec['failure_class']}" if rec.get("failure_class") else ""
            if rec["status"] == "xpassed" or not rec.get("failure_class"):
                lines.append(f"{rec['id']}: [{rec['status']}] {rec.get('verdict', '')}")
            else:
                known = f" known failure {rec['known_failure']} {rec.get('known_failure_link')}" \
                    if rec.get("known_failure") else ""
                lines.append(f"{rec['id']}: [{rec['status']}{cls}{rank}]{known} {rec.get('error_line') or ''}")
            lines.append(f"    logs: {rec.get('log_dir', '')}")
        if rec.get("plot"):
            lines.append(f"    loss curve: {rec['plot']}")
    compared = [rec for rec in run["cells"] if rec.get("numerics")]
    if compared:
        lines.append("numerics (≡ bitwise equal to the baseline, ≈ within the lane's tolerance):")
        for rec in compared:
            n = rec["numerics"]
            lines.append(f"    {rec['id']} vs {n['baseline']}: lane {n['lane']}, max |diff| {n['max_abs_diff']:.3g}, "
                         f"max rel {n['max_rel_diff']:.3g}, steps off {n['missed_steps']}{_params_note(n)}")
    shown = [rec for rec in run["cells"] if rec.get("evidence")]
    if shown:
        lines.append("evidence (the run shows its label: checks that hold / checks, labels checked):")
        for rec in shown:
            held = sum(1 for e in rec["evidence"] if e["ok"])
            labels = ", ".join(dict.fromkeys(e["axis"] for e in rec["evidence"]))
            lines.append(f"    {rec['id']}: {held}/{len(rec['evidence'])} ({labels})")
    by_rule = Counter(rec["rule"] for rec in run["dropped"])
    if by_rule:
        lines.append(f"n/a: {sum(by_rule.values())} cells dropped by rule: "
                     + ", ".join(f"{rule} {n}" for rule, n in by_rule.most_common()))
    return lines


def _params_note(numerics):
    """The per-parameter comparison in a few words (numerics.compare_params)."""
    params = numerics.get("params")
    if isinstance(params, str):
        return f"; per parameter: {params}"
    if not params:
        return ""
    grads = params["max_rel_diff"].get("grad_norm", {})
    judged = [v for step, v in grads.items() if int(step) <= params["grad_steps"]]
    first = params["first_difference"]
    differs = f"{first['param']} ({first['kind']}, step {first['step']})" if first else "none"
    return (f"; per parameter: {params['checked']} compared (steps <= {params['grad_steps']}), grad max rel "
            f"{max(judged, default=0.0):.3g}, first difference {differs}")


def summary_counts(run):
    counts = Counter(rec.get("status") for rec in run["cells"])
    ran = ", ".join(f"{n} {status}" for status, n in counts.most_common()) or "none"
    valid = run["meta"].get("cells", len(run["cells"]))
    return f"{len(run['cells'])} of {valid} valid cells run ({ran}); {len(run['dropped'])} combinations n/a"


def render_text(doc):
    out = []
    for run in doc["runs"]:
        meta = run["meta"]
        counts = mutation_score(run) if run.get("mutants") and not run["cells"] else summary_counts(run)
        out.append(f"simplefsdp matrix {meta.get('matrix', '?')} (profile {meta.get('profile', '?')}, "
                   f"target {meta.get('target', '?')}, launcher {meta.get('launcher', '?')}): {counts}")
        if meta.get("tier") == "trace":
            out.append(TRACE_NOTE)
        if run["cells"]:
            headers, body = grid(run)
            out.append(tabulate(body, headers=headers, tablefmt="simple"))
        if run.get("mutants"):
            out.append(tabulate(mutation_rows(run), headers=MUTATION_HEADERS, tablefmt="simple"))
        out.extend(footnotes(run))
        out.append("")
    return "\n".join(out)


MUTATION_HEADERS = ("mutant", "cell", "verdict", "killed by", "first failing check")


def mutation_score(run):
    killed = sum(1 for m in run["mutants"] if m.get("mutation") == "killed")
    return f"mutation tier: {killed} of {len(run['mutants'])} mutant runs killed"


def mutation_rows(run, width=110):
    """One row per mutated run; the cell id without its mutant suffix."""
    rows = []
    for m in run["mutants"]:
        cell = m["id"].rsplit("[mutant-", 1)[0]
        verdict = m.get("mutation") or "?"
        line = m.get("error_line") or ""
        rows.append((m["mutant"], cell, verdict, m.get("killed_by") or "-",
                     line if len(line) <= width else line[:width - 3] + "..."))
    return rows


STATUS_MD = {"passed": "✅", "failed": "❌", "xfailed": "🚧", "xpassed": "⚠️", "skipped": "⏭️", "dropped": "➖"}
LEGEND = ("✅ passes · ❌ fails (new) · 🚧 known failure (xfail) · 🔁 known flaky · ⚠️ known failure that passed "
          "(XPASS: delete its entry) · ⏭️ skipped · ➖ n/a (ruled out) · 🆕 newly broken · 🎉 newly fixed · "
          "🔀 failure signature changed since the compared run")
TRACE_NOTE = ("TRACE TIER: each cell ran as ONE simulated rank on a CPU machine (fake process group): config, "
              "parallelisation, tracing and one step were checked; numerics were not; this is not a GPU run")
MARKS = {"newly broken": "🆕", "newly fixed": "🎉", "changed signature": "🔀"}


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
        for model, cells in models.items():
            out.append(f"## {model or meta.get('matrix', '?')} — profile {meta.get('profile', '?')}{tier}")
            out.append("")
            out.append(f"{meta.get('matrix', '?')}, target {meta.get('target', '?')}, {versions}, "
                       f"{meta.get('date', '')}")
            out.append("")
            sub = {"meta": meta, "cells": [], "dropped": [dict(d, row=_strip(d["row"], model)) for d in run["dropped"]
                                            if d["axes"].get("model", "") == model]}
            for rec in cells:
                symbol = "🔁" if rec.get("flaky") else STATUS_MD.get(rec["status"], rec["status"])
                mark = MARKS.get(changes.get(f"{meta.get('matrix')}::{rec['id']}", ""), "")
                note = _note(rec)
                if note:
                    notes.append(note)
                    symbol += f"[^{len(notes)}]"
                sub["cells"].append({**rec, "row": _strip(rec["row"], model), "status": symbol + mark})
            headers, body = grid(sub, markdown=False, symbols=False)
            out.append(tabulate(body, headers=headers, tablefmt="github"))
            out.append("")
        if run.get("mutants"):
            out.extend([f"## mutation tier — profile {meta.get('profile', '?')}: {mutation_score(run)}", "",
                        tabulate(mutation_rows(run), headers=MUTATION_HEADERS, tablefmt="github"), ""])
    if notes:
        out.extend(f"[^{i}]: {note}" for i, note in enumerate(notes, 1))
        out.append("")
    return "\n".join(out)


def _strip(row, model):
    """The row label without the model (each model has its own table)."""
    if model and row.startswith(model):
        return row[len(model):].strip() or "-"
    return row


def _note(rec):
    if rec["status"] in ("xfailed", "skipped") and rec.get("known_failure"):
        return (f"`{rec['id']}`: known failure `{rec['known_failure']}` ({rec.get('known_failure_link')}): "
                f"{rec.get('error_line') or rec.get('verdict') or ''}")
    if rec["status"] == "failed":
        return f"`{rec['id']}`: {rec.get('failure_class')}: {rec.get('error_line') or ''}"
    if rec["status"] == "xpassed":
        return f"`{rec['id']}`: {rec.get('verdict', '')}"
    return None


def compare_runs(old_doc, new_doc):
    """{"matrix::id": "newly broken" | "newly fixed" | "changed signature"} between two runs."""
    def index(doc):
        return {f"{run['meta'].get('matrix')}::{rec['id']}": rec for run in doc["runs"] for rec in run["cells"]}

    old, changes = index(old_doc), {}
    for key, rec in index(new_doc).items():
        before = old.get(key)
        if before is None:
            continue
        was_bad = before["status"] == "failed" or before["status"] == "xfailed"
        is_bad = rec["status"] in ("failed", "xfailed")
        if is_bad and not was_bad:
            changes[key] = "newly broken"
        elif was_bad and not is_bad and rec["status"] != "skipped":
            changes[key] = "newly fixed"
        elif was_bad and is_bad and before.get("signature") != rec.get("signature"):
            changes[key] = "changed signature"
    return changes


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pytest_simplefsdp.report",
                                     description="Render a stored simplefsdp run (JSON or JSON lines).")
    parser.add_argument("run", help="a --simplefsdp-json document or a run's results.jsonl")
    parser.add_argument("--format", choices=("text", "md", "json"), default="text")
    args = parser.parse_args(argv)
    try:
        doc = load_run(args.run)
    except OSError as e:
        parser.error(f"{args.run}: {e.strerror}")
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:  # byte for byte what --simplefsdp-status-md wrote for the same run
        sys.stdout.write(render_md(doc) if args.format == "md" else render_text(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
