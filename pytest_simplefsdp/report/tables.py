"""Step 7: the composability table in the terminal, rendered from a run's records alone: one grid per matrix
(rows are layouts, columns compile x backend x memory policy, and the share of the model's parameter bytes a rank of
the layout holds), its footnotes, the mutation tier's table."""

from __future__ import annotations

from collections import Counter, OrderedDict

from tabulate import tabulate

from ..judge.known import signature
from ..kinds import Status
from ..paths import shown
from ..words import plural
from . import memory

SYMBOLS = {
    Status.PASSED: "pass",
    Status.FAILED: "FAIL",
    Status.XFAILED: "xfail",
    Status.XPASSED: "XPASS",
    Status.SKIPPED: "skip",
    "dropped": "n/a",
}
NOT_RUN = "·"  # a valid cell this run did not select; a blank is a combination the matrix's `exclude` removed
STATUS_MD = {
    Status.PASSED: "✅",
    Status.FAILED: "❌",
    Status.XFAILED: "🚧",
    Status.XPASSED: "⚠️",
    Status.SKIPPED: "⏭️",
    "dropped": "➖",
}
GRID_KEY = f"{NOT_RUN} valid, not run this time · blank: not in the profile (its `exclude`)"
TRACE_NOTE = (
    "TRACE TIER: each cell ran as ONE simulated rank on a CPU machine (fake process group): config, "
    "parallelisation, tracing and one step were checked; numerics were not; this is not a GPU run"
)
TRACE_GPU_NOTE = (
    "TRACE TIER, ONE GPU, SIMULATED RANKS: each cell ran as ONE simulated rank on one GPU (fake process group: "
    "no other rank ran and no collective moved data); that rank's kernels, steps and memory are real, its "
    "losses are not a real run's; numerics were not compared; this is not a multi-GPU run"
)


def trace_note(meta) -> str | None:
    """What a trace run's reports say above its cells (None for the real tier): where its simulated ranks ran."""
    if meta.get("tier") in (None, "real"):
        return None
    return TRACE_GPU_NOTE if meta.get("device") == "cuda" else TRACE_NOTE


def cell_text(rec):
    status = rec.get("status", "dropped")
    text = SYMBOLS.get(status, status)
    if rec.get("flaky"):
        text = "flaky " + ("pass" if status == Status.PASSED else "fail")
    if status == Status.FAILED and rec.get("failure_class"):
        text += f" {rec['failure_class']}"
    if rec.get("numerics") and status == Status.PASSED:
        text += " ≡" if rec["numerics"]["max_abs_diff"] == 0 else " ≈"
    if rec.get("wall") and status not in ("dropped", Status.SKIPPED):
        text += f" {rec['wall']:.0f}s"
    return text


def grid(run, cell=None, na=None, not_run=NOT_RUN, every_row=False):
    """(headers, rows) of one matrix: rows are layouts, columns compile × memory policy. ``cell(rec)``: a run cell's
    text (default: cell_text); ``na(rec)``: a dropped combination's (default: n/a); ``not_run``: a valid cell's that
    did not run. Rows and columns: those with a cell that ran, or (``every_row``) every valid one."""
    cell, na = cell or cell_text, na or (lambda rec: SYMBOLS["dropped"])
    cells, valid = run["cells"], run.get("valid", run.get("meta", {}).get("valid", []))
    rows, cols = OrderedDict(), OrderedDict()
    for rec in cells + (valid if every_row else []):
        rows.setdefault(rec["row"], {})
        cols.setdefault(rec["column"], None)
    order = {c: i for i, c in enumerate(run.get("meta", {}).get("columns", []))}  # the matrix's column order
    cols = OrderedDict((c, None) for c in sorted(cols, key=lambda c: order.get(c, len(order))))
    for rec in run["dropped"]:
        if rec["row"] in rows and rec["column"] in cols:
            rows[rec["row"]].setdefault(rec["column"], na(rec))
    for place in valid:
        if place["row"] in rows and place["column"] in cols:
            rows[place["row"]].setdefault(place["column"], not_run)
    for rec in cells:
        rows[rec["row"]][rec["column"]] = cell(rec)
    headers = ["layout", *cols]
    body = [[row, *(entries.get(c, "") for c in cols)] for row, entries in rows.items()]
    if any(rec.get("memory") for rec in cells):  # a layout's share of the model per rank (memory.short)
        headers.append("memory: share/rank ×expected")
        for line in body:
            line.append(memory.column([rec for rec in cells if rec["row"] == line[0]]))
    return headers, body


def footnotes(run, verbose=False, root="."):
    """What the grid cannot say: each failure's line, signature and logs; the numerics and evidence of the cells
    (per cell with ``verbose``, else summed up, per cell only where a cell did not pass); the rules' drops."""
    lines = []
    for rec in run["cells"]:
        if rec.get("status") in (Status.FAILED, Status.XFAILED, Status.XPASSED):
            rank = f", rank {rec['failing_rank']}" if rec.get("failing_rank") is not None else ""
            cls = f" {rec['failure_class']}" if rec.get("failure_class") else ""
            if rec["status"] == Status.XPASSED or not rec.get("failure_class"):
                lines.append(f"{rec['id']}: [{rec['status']}] {rec.get('verdict', '')}")
            else:
                known = (
                    f" known failure {rec['known_failure']} {rec.get('known_failure_link')}"
                    if rec.get("known_failure")
                    else ""
                )
                lines.append(f"{rec['id']}: [{rec['status']}{cls}{rank}]{known} {rec.get('error_line') or ''}")
                if not rec.get("known_failure"):  # what a new known-failures entry's `error` would match
                    lines.append(f"    signature: {rec_signature(rec)[:300]}")
            lines.append(f"    logs: {shown(rec.get('log_dir'), root)}")
        if rec.get("plot"):
            lines.append(f"    loss and grad-norm curves: {shown(rec['plot'], root)}")
    lines.extend(_proofs(run, verbose))
    by_rule = Counter(rec["rule"] for rec in run["dropped"])
    if by_rule:
        lines.append(
            f"n/a: {plural(sum(by_rule.values()), 'cell')} dropped by rule: "
            + ", ".join(f"{rule} {n}" for rule, n in by_rule.most_common())
        )
    return lines


def _proofs(run, verbose):
    """The numerics and evidence lines: quiet on success, as pytest is (details for failures, more with -v)."""
    lines = []
    compared = [rec for rec in run["cells"] if rec.get("numerics")]
    checked = [rec for rec in run["cells"] if rec.get("evidence")]
    if not verbose:
        if compared:
            off = sum(1 for rec in compared if rec.get("failure_class") == "numerics")
            equal = sum(1 for rec in compared if rec["numerics"]["max_abs_diff"] == 0)
            lines.append(
                f"numerics: {plural(len(compared), 'cell')} compared with their baselines ({equal} bitwise "
                f"equal, {len(compared) - equal - off} within their tolerances" + (f", {off} outside)" if off else ")")
            )
            for kind in ("not applied", "unmeasured"):
                held = [
                    rec["numerics"]["noise"] for rec in compared if rec["numerics"].get("noise", "").startswith(kind)
                ]
                if held:  # measured elsewhere, or never: these cells had their lane's wider tolerance
                    lines.append(
                        f"    {plural(len(held), 'cell')} judged by their lane, not their layout's noise: "
                        f"{held[0].removeprefix('not applied: ')}"
                    )
        if checked:
            checks = [e["ok"] for rec in checked for e in rec["evidence"]]
            lines.append(
                f"evidence: {plural(len(checked), 'cell')} checked against their labels ({sum(checks)} of "
                f"{plural(len(checks), 'check')} hold)"
            )
        if compared or checked:
            lines.append("    (-v lists them per cell)")
        compared = [rec for rec in compared if rec.get("status") != "passed"]
        checked = [rec for rec in checked if rec.get("status") != "passed"]
    if compared:
        lines.append("numerics (≡ bitwise equal to the baseline, ≈ within its tolerance):")
        for rec in compared:
            n = rec["numerics"]
            lines.append(
                f"    {rec['id']} vs {n['baseline']}: lane {n['lane']}, max |diff| {n['max_abs_diff']:.3g}, "
                f"max rel {n['max_rel_diff']:.3g}, steps off {n['missed_steps']}{_params_note(n)}"
                + (f"; {n['noise']}" if n.get("noise") else "")
            )
    if checked:
        lines.append("evidence (the run shows its label: checks that hold / checks, labels checked):")
        for rec in checked:
            held = sum(1 for e in rec["evidence"] if e["ok"])
            labels = ", ".join(dict.fromkeys(e["axis"] for e in rec["evidence"]))
            lines.append(f"    {rec['id']}: {held}/{len(rec['evidence'])} ({labels})")
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
    return (
        f"; per parameter: {params['checked']} compared (steps <= {params['grad_steps']}), grad max rel "
        f"{max(judged, default=0.0):.3g}, first difference {differs}"
    )


def summary_counts(run):
    """ "6 of 69 valid cells run (4 passed, 2 xfailed); 778 combinations n/a": never more than what ran."""
    counts = Counter(rec.get("status") for rec in run["cells"])
    ran = ", ".join(f"{n} {status}" for status, n in counts.most_common()) or "none"
    valid = run["meta"].get("cells", len(run["cells"]))
    return (
        f"{len(run['cells'])} of {plural(valid, 'valid cell')} run ({ran}); "
        f"{plural(len(run['dropped']), 'combination')} n/a"
    )


def ran_under(run):
    """The launchers the cells ran under, and the one asked for where that differs (a command target asked to
    fork runs under local)."""
    asked = run["meta"].get("launcher", "?")
    used = list(dict.fromkeys(rec["launcher"] for rec in run["cells"] if rec.get("launcher")))
    return asked if not used or used == [asked] else f"{', '.join(used)} (asked: {asked})"


def render_text(doc, verbose=False, root="."):
    """The terminal's report of a run; ``verbose`` (-v) lists every cell's numerics and evidence; paths relative to
    ``root`` (the rootdir) where they lie under it."""
    out = []
    for run in doc["runs"]:
        meta = run["meta"]
        counts = mutation_score(run) if run.get("mutants") and not run["cells"] else summary_counts(run)
        out.append(
            f"simplefsdp matrix {meta.get('matrix', '?')} (profile {meta.get('profile', '?')}, "
            f"target {meta.get('target', '?')}, launcher {ran_under(run)}): {counts}"
        )
        if note := trace_note(meta):
            out.append(note)
        if run["cells"]:
            headers, body = grid(run)
            out.append(tabulate(body, headers=headers, tablefmt="simple"))
            if any(v in ("", NOT_RUN) for row in body for v in row[1:]):
                out.append(GRID_KEY)
            if len(run["cells"]) < run["meta"].get("cells", 0):
                out.append(
                    "(rows where no cell ran are left out here; the status markdown and the page show every valid cell)"
                )
        if run.get("mutants"):
            out.append(tabulate(mutation_rows(run), headers=MUTATION_HEADERS, tablefmt="simple"))
        out.extend(footnotes(run, verbose, root))
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
        rows.append(
            (
                m["mutant"],
                cell,
                verdict,
                (m.get("killed_by") or "-") + (" (+ numerics)" if m.get("also_killed_by") else ""),
                line if len(line) <= width else line[: width - 3] + "...",
            )
        )
    return rows


def where_line(meta):
    """Host, GPUs and source revisions of the run, where its meta record has them."""
    parts = [f"host {meta['host']}"] if meta.get("host") else []
    if "gpus" in meta:
        parts.append(f"GPUs: {', '.join(meta['gpus']) or 'none'}")
    parts.extend(f"{k} rev {v[:12]}" for k, v in (meta.get("revisions") or {}).items())
    return "; " + ", ".join(parts) if parts else ""


def broken(rec):
    """Whether a stored cell's run failed (a known failure too); None where it did not run. A known failure
    that passed is not broken, whether the gate made it a failure (no failure class) or an XPASS."""
    status = rec.get("status")
    if status in (Status.SKIPPED, "dropped", None):
        return None
    if status == Status.FAILED:
        return bool(rec.get("failure_class")) or not rec.get("known_failure")
    return status == Status.XFAILED


def rec_signature(rec):
    """A stored record's failure signature, made again from its error text (a record stored before a placeholder
    was added keeps the older form otherwise)."""
    return signature(rec.get("error_text") or rec.get("error_line")) or rec.get("signature") or ""
