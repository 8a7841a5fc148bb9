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
from pathlib import Path

from tabulate import tabulate

from . import schema
from .matrix import MatrixError
from .verdict import load_known_failures, rejudge, signature

WALLTIME_PLOT = "walltime.png"
SYMBOLS = {"passed": "pass", "failed": "FAIL", "xfailed": "xfail", "xpassed": "XPASS", "skipped": "skip",
           "dropped": "n/a"}
NOT_RUN = "·"  # a valid cell this run did not select; a blank is a combination the matrix's `exclude` removed
GRID_KEY = f"{NOT_RUN} valid, not run this time · blank: not in the profile (its `exclude`)"


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
    doc = {"runs": list(runs.values())}
    plot = Path(path).resolve().parent / WALLTIME_PLOT  # the run folder's overview plot, written at its end
    if plot.exists():
        doc["walltime_plot"] = str(plot)
    return doc


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
    for place in run.get("valid", run.get("meta", {}).get("valid", [])):
        if place["row"] in rows and place["column"] in cols:
            rows[place["row"]].setdefault(place["column"], NOT_RUN)
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
                if not rec.get("known_failure"):  # what a new known-failures entry's `error` would match
                    lines.append(f"    signature: {_signature(rec)[:300]}")
            lines.append(f"    logs: {rec.get('log_dir', '')}")
        if rec.get("plot"):
            lines.append(f"    loss and grad-norm curves: {rec['plot']}")
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
            if any(v in ("", NOT_RUN) for row in body for v in row[1:]):
                out.append(GRID_KEY)
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
          "🔀 failure signature changed since the compared run · " + GRID_KEY)
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


def where_line(meta):
    """Host, GPUs and source revisions of the run, where its meta record has them."""
    parts = [f"host {meta['host']}"] if meta.get("host") else []
    if "gpus" in meta:
        parts.append(f"GPUs: {', '.join(meta['gpus']) or 'none'}")
    parts.extend(f"{k} rev {v[:12]}" for k, v in (meta.get("revisions") or {}).items())
    return "; " + ", ".join(parts) if parts else ""


# the features of the status-tracking issue (torchtitan 1980), each the axis values that turn it on
FEATURE_GROUPS = (
    ("Parallelisms", {"dp_replicate": "DDP / HSDP (dp_replicate > 1)", "dp_shard": "FSDP (dp_shard > 1)",
                      "tp": "TP (tp > 1)", "ep": "EP (ep > 1)", "etp": "ETP (etp > 1)", "cp": "CP (cp > 1)",
                      "pp": "PP (pp > 1)"}),
    ("Compile modes", {"compile": "compile {}", "backend": "backend {}"}),
    ("Memory policies", {"memory_policy": "memory policy {}", "ac": "activation checkpointing {}"}),
    ("PP schedules", {"pp_schedule": "{}"}),
    ("Models", {"model": "{}"}),
    ("Features", {"feature": "{}", "trainer": "trainer {}"}),
)


def features(run):
    """[(group, [(feature, state, cells, entries)])] of one matrix, rolled up from its cells: Done where every
    cell with the feature that ran passed, In progress where the others are known failures (entries: their
    (id, link)), Failing where one failed with a new error, Not run where none ran."""
    out = []
    for group, axes in FEATURE_GROUPS:
        rows = []
        for axis, label in axes.items():
            values = list(dict.fromkeys(rec["axes"][axis] for rec in run["cells"] if axis in rec["axes"]))
            for value in values:
                if isinstance(value, int) and not isinstance(value, bool):
                    cells = [r for r in run["cells"] if (r["axes"].get(axis) or 0) > 1]
                    name = label
                elif value == "none":
                    continue
                else:
                    cells = [r for r in run["cells"] if r["axes"].get(axis) == value]
                    name = label.format(value)
                if cells and all(name != r[0] for r in rows):
                    rows.append((name, *_state(cells)))
        if rows:
            out.append((group, rows))
    return out


def _state(cells):
    ran = [r for r in cells if r["status"] != "skipped"]
    entries = list(dict.fromkeys((r["known_failure"], r.get("known_failure_link")) for r in cells
                                 if r.get("known_failure") and r["status"] in ("xfailed", "skipped")))
    if any(r["status"] == "failed" and r.get("failure_class") for r in ran):  # (a gate's XPASS is no failure)
        state = "Failing"
    elif entries:
        state = "In progress"
    elif ran:
        state = "Done"
    else:
        state = "Not run"
    return state, cells, entries


def status_view_md(run):
    """The status by feature, in the tracking issue's shape: a checklist per group with the entries' links."""
    groups = features(run)
    if not groups:
        return []
    out = [f"## Status by feature — profile {run['meta'].get('profile', '?')}", "",
           "Rolled up from the cells below: Done where every cell with the feature passes, In progress where the "
           "others fail as known failures, Failing where one fails with a new error, Not run where none ran.", ""]
    for group, rows in groups:
        out.append(f"**{group}**")
        out.append("")
        for name, state, cells, entries in rows:
            passed = sum(1 for r in cells if broken(r) is False)
            links = "; known failures: " + ", ".join(f"[`{e}`]({link})" for e, link in entries) if entries else ""
            out.append(f"- [{state}] {name}: {passed} of {len(cells)} cells pass{links}")
        out.append("")
    return out


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


def key(meta, rec):
    """A cell's key across runs: profile (and tier) and cell id, never the matrix file's path, which depends
    on the rootdir a run started from (CI and a laptop name the same file differently)."""
    tier = "[trace]" if meta.get("tier") == "trace" else ""
    return f"{meta.get('profile')}{tier}::{rec['id']}"


def broken(rec):
    """Whether a stored cell's run failed (a known failure too); None where it did not run. A known failure
    that passed is not broken, whether the gate made it a failure (no failure class) or an XPASS."""
    status = rec.get("status")
    if status in ("skipped", "dropped", None):
        return None
    if status == "failed":
        return bool(rec.get("failure_class")) or not rec.get("known_failure")
    return status == "xfailed"


def _signature(rec):
    return rec.get("signature") or signature(rec.get("error_text") or rec.get("error_line"))


def compare_runs(old_doc, new_doc):
    """{key: "newly broken" | "newly fixed" | "changed signature"} between two runs (cells in both that ran
    in both; see ``key``)."""
    def index(doc):
        return {key(run["meta"], rec): rec for run in doc["runs"] for rec in run["cells"]}

    old, changes = index(old_doc), {}
    for k, rec in index(new_doc).items():
        before = old.get(k)
        was, now = (None, None) if before is None else (broken(before), broken(rec))
        if was is None or now is None:
            continue
        if now and not was:
            changes[k] = "newly broken"
        elif was and not now:
            changes[k] = "newly fixed"
        elif was and now and _signature(before) != _signature(rec):
            changes[k] = "changed signature"
    return changes


def change_lines(changes):
    """(text, is_good) per change, for the terminal and the report tool alike."""
    return [(f"{change}: {k}", change == "newly fixed") for k, change in changes.items()] or [("no cell changed", True)]


def known_for(path, doc):
    """A known-failures file loaded to re-judge a stored run: conditions may name the run's axes, the shipped
    profiles' axes and upstream's (an entry for another matrix simply matches nothing here)."""
    from .matrix import MatrixError, load_matrix
    from .profiles import MATRIX_DIR
    from .upstream import UPSTREAM_AXES

    names = set(UPSTREAM_AXES) | {a for run in doc["runs"] for rec in run["cells"] + run["dropped"] for a in rec["axes"]}
    for p in MATRIX_DIR.glob("*.yaml"):
        try:
            names |= set(load_matrix(p).axes)
        except MatrixError:
            pass  # an upstream-sourced profile whose torchtitan is not installed here
    return load_known_failures(path, names)


def rejudged(doc, known, gate=False):
    """The run with every cell judged again against ``known`` (verdict.rejudge), the environment read from each
    matrix's meta record."""
    runs = []
    for run in doc["runs"]:
        meta = run["meta"]
        v = meta.get("versions") or {}
        env = {"profile": meta.get("profile"), "target": meta.get("target"), "device": meta.get("device"),
               "tier": meta.get("tier", "real"), "torch": v.get("torch"), "torchtitan": v.get("torchtitan")}
        runs.append({**run, "cells": [rejudge(rec, known, env, gate) for rec in run["cells"]]})
    return {**doc, "runs": runs}


SHIPPED_KNOWN_FAILURES = Path(__file__).resolve().parent.parent / "known_failures.yaml"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pytest_simplefsdp.report",
        description="Render a stored simplefsdp run (JSON or JSON lines), judged again against a known-failures "
                    "file, optionally compared with an older run.")
    parser.add_argument("run", help="a --simplefsdp-json document or a run's results.jsonl")
    parser.add_argument("--format", choices=("text", "md", "json"), default="text",
                        help="text (the terminal table), md (the status markdown), json (the run document)")
    parser.add_argument("--known-failures", metavar="YAML", type=Path, default=None,
                        help=f"re-judge every cell against this file (default: the shipped {SHIPPED_KNOWN_FAILURES.name})")
    parser.add_argument("--as-stored", action="store_true",
                        help="show the verdicts the run stored, without judging again")
    parser.add_argument("--gate", action="store_true", help="judge as --simplefsdp-gate does (XPASS fails)")
    parser.add_argument("--compare", metavar="OLD", type=Path,
                        help="an older stored run: list newly broken, newly fixed and changed-signature cells "
                             "(matched by profile and cell id) and mark them in the tables")
    parser.add_argument("--html", metavar="DIR", type=Path,
                        help="also write the run as a static HTML page (DIR/index.html)")
    args = parser.parse_args(argv)
    if args.as_stored and (args.known_failures or args.gate):
        parser.error("--as-stored shows the stored verdicts: it takes no --known-failures or --gate")
    doc = _load(parser, args.run)
    old = _load(parser, args.compare) if args.compare else None
    if not args.as_stored:
        path = args.known_failures or SHIPPED_KNOWN_FAILURES
        try:
            doc = rejudged(doc, known_for(path, doc), args.gate)
        except OSError as e:
            parser.error(f"--known-failures: {path}: {e.strerror}")
        except MatrixError as e:
            raise SystemExit(f"--known-failures: {e}") from None
        print(f"re-judged against {path}", file=sys.stderr)
    if old is not None:
        doc["comparison"] = compare_runs(old, doc)
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:  # byte for byte what --simplefsdp-status-md wrote for the same run and known failures
        sys.stdout.write(render_md(doc) if args.format == "md" else render_text(doc) + "\n")
    if old is not None and args.format == "text":
        sys.stdout.write(f"changes since {args.compare}:\n")
        sys.stdout.writelines(f"  {line}\n" for line, _ in change_lines(doc["comparison"]))
    if args.html:
        from . import page

        print(f"html: {page.write(doc, args.html)}", file=sys.stderr)
    return 0


def _load(parser, path):
    try:
        return load_run(path)
    except OSError as e:
        parser.error(f"{path}: {e.strerror}")


if __name__ == "__main__":
    sys.exit(main())
