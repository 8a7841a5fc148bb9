"""Step 7, for a browser: a run as one static HTML page, a triage rather than a list. Failures first, grouped new /
known / flaky / fixed, each with its error line, failing rank, entry and link, and its log; then the changes since
a compared run (named); the status by feature and which combinations fail; per profile and model the grid with
every valid cell (an n/a cell's rule on hover); then each cell's details: numerics, evidence, invariants, logs, the
reproducer folded. Filters by status (checkboxes, or ``#only=failed,xfailed`` in the address). Readable from disk
without a server; every link is relative to the page. Written as ``DIR/index.html``, or as one self-contained file
(``*.html``: plots inlined) for attaching to an issue or a CI run."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from tabulate import tabulate

from ..kinds import Status
from ..words import plural
from . import gate, memory
from .combos import failing_combinations
from .compare import MARKS, key
from .markdown import LEGEND, model_grid
from .status import features
from .tables import NOT_RUN, grid, summary_counts, trace_note, where_line

STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:90em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;font-size:90%;vertical-align:top}a{text-decoration:none}
.failed{background:#fdd}.xfailed{background:#ffe9c6}.passed{background:#e6f6e6}.xpassed{background:#f0e0ff}
.flaky{background:#e0f0ff}.skipped,.notrun{color:#888}.na{color:#aaa}code,pre{font-size:85%;white-space:pre-wrap}
li{margin:.15em 0}nav label{margin-right:1em}.hidden{display:none}.dim{opacity:.15}h2{border-bottom:1px solid #ddd}
.error{font-family:monospace;font-size:85%}"""
# every status a filter can show or hide (a cell's data-status): the outcomes, a known flaky cell, a cell not run
FILTERS = ("failed", "xfailed", "flaky", "xpassed", "passed", "skipped", "notrun")
SCRIPT = """function apply(){var off=[];document.querySelectorAll('nav input').forEach(function(b){if(!b.checked)
off.push(b.value)});document.querySelectorAll('[data-status]').forEach(function(e){var hide=off.indexOf(
e.dataset.status)>=0;if(e.tagName=='TD'){e.classList.toggle('dim',hide)}else{e.classList.toggle('hidden',hide)}})}
function init(){var m=location.hash.match(/only=([a-z,]+)/);if(m){var on=m[1].split(',');document.querySelectorAll(
'nav input').forEach(function(b){b.checked=on.indexOf(b.value)>=0})}document.querySelectorAll('nav input').forEach(
function(b){b.addEventListener('change',apply)});apply()}document.addEventListener('DOMContentLoaded',init)"""
GROUPS = (
    ("new", "New failures", "failed with an error no known-failures entry expects"),
    ("known", "Known failures", "failed as a known-failures entry says"),
    ("flaky", "Known flaky", "a flaky entry's cell, this time"),
    ("fixed", "Fixed", "a known failure that passed: delete its entry"),
)


def write(doc, target: Path) -> Path:
    """Write the page for a run document (store.runs.load_run's shape): ``target/index.html``, or ``target`` itself
    when it names a ``.html`` file (self-contained). Returns its path."""
    target = Path(target)
    path = target if target.suffix == ".html" else target / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(doc, path.parent, inline=target.suffix == ".html"))
    return path


def status_of(rec) -> str:
    """The status a filter sees: the outcome, or flaky for a known flaky cell."""
    return "flaky" if rec.get("flaky") else str(rec["status"])


def group_of(rec) -> str | None:
    if rec.get("flaky"):
        return "flaky"
    if rec["status"] == Status.XPASSED or (rec["status"] == Status.FAILED and not rec.get("failure_class")):
        return "fixed"
    if rec["status"] == Status.XFAILED:
        return "known"
    if rec["status"] == Status.FAILED:
        return "new"
    return None


def render(doc, folder: Path, inline=False) -> str:
    link, image = _linker(folder), (_inline if inline else None)
    runs = doc["runs"]
    cells = [(run, rec) for run in runs for rec in run["cells"]]
    title = "; ".join(f"{run['meta'].get('profile')}: {summary_counts(run)}" for run in runs)
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>SimpleFSDP composability — {_e(title)}</title><style>{STYLE}</style><script>{SCRIPT}</script>",
        "</head><body><h1>SimpleFSDP composability status</h1>",
    ]
    out.extend(
        f"<p class='summary'><b>{_e(run['meta'].get('profile'))}</b>: {_e(summary_counts(run))}</p>" for run in runs
    )
    out.append(
        "<nav>show: "
        + "".join(f"<label><input type='checkbox' value='{f}' checked> {f}</label>" for f in FILTERS)
        + "</nav>"
    )
    out.extend(
        f"<p class='incident'><b>launcher incident:</b> <code>{_e(line)}</code></p>"
        for line in doc.get("incidents") or ()
    )
    out.extend(_gate(doc))
    out.extend(_failures(cells, link))
    out.extend(_bisections(doc, link))
    out.extend(_changes(doc))
    for run in runs:
        out.extend(_run(run, doc.get("comparison") or {}, link))
    out.append(f"<p class='legend'>{_e(LEGEND)}</p>")
    if doc.get("walltime_plot"):
        out.append(_img(doc["walltime_plot"], "wall time per cell", link, image))
    out.append("<h2 id='cells'>Cells</h2><ul class='details'>")
    out.extend(_details(rec, link, image) for _, rec in cells)
    out.append("</ul></body></html>")
    return "\n".join(out) + "\n"


def _gate(doc):
    """--simplefsdp-base: the PR's failures as new, broken trunk, flaky or known, both sides' signatures."""
    pr = gate.gate(doc)
    if pr is None:
        return []
    out = [f"<h2 id='gate'>{_e(gate.headline(pr))}</h2><ul>"]
    out += [f"<li><b>{_e(c)}</b>: {_e(m)}</li>" for c, m in gate.MEANING.items()]
    out.append("</ul>")
    if pr["failures"]:
        out.append(tabulate(gate.rows(pr), headers=("cell", "class", "signature here", "on the base"), tablefmt="html"))
    extra = gate.numerics_lines(pr)
    if extra:
        out.append(f"<p>{_e(extra[0])}</p><ul>" + "".join(f"<li>{_e(x.strip())}</li>" for x in extra[1:]) + "</ul>")
    return out


def _failures(cells, link):
    out = ["<h2 id='failures'>Failures first</h2>"]
    grouped = {g: [] for g, _, _ in GROUPS}
    for run, rec in cells:
        group = group_of(rec)
        if group:
            grouped[group].append((run, rec))
    if not any(grouped.values()):
        return out + ["<p>No cell failed.</p>"]
    for group, title, what in GROUPS:
        if not grouped[group]:
            continue
        out.append(
            f"<h3 id='failures-{group}'>{title} ({len(grouped[group])})</h3><p>{what}</p>"
            f"<table class='failures'><tr><th>cell</th><th>class</th><th>rank</th><th>error</th>"
            f"<th>entry</th><th>log</th></tr>"
        )
        for run, rec in grouped[group]:
            entry = (
                f"<a href='{_e(rec['known_failure_link'])}'>{_e(rec['known_failure'])}</a>"
                if rec.get("known_failure_link")
                else ""
            )
            log = main_log(rec)
            error = rec.get("error_line") or rec.get("verdict") or ""
            error += f" (compiler step: {rec['compiler_step']})" if rec.get("compiler_step") else ""
            rank = "" if rec.get("failing_rank") is None else rec["failing_rank"]
            out.append(
                f"<tr class='{_e(rec['status'])}' data-status='{_e(status_of(rec))}'>"
                f"<td><a href='#cell-{_e(rec['id'])}'>{_e(run['meta'].get('profile'))}::{_e(rec['id'])}</a></td>"
                f"<td>{_e(rec.get('failure_class') or '')}</td><td>{_e(rank)}</td>"
                f"<td class='error'>{_e(error)}</td><td>{entry}</td>"
                f"<td>{f'<a href={_q(link(log))}>log</a>' if log else ''}</td></tr>"
            )
        out.append("</table>")
    return out


def _bisections(doc, link):
    """--simplefsdp-bisect: per bisected cell, what was searched, what it found, its probes and its issue body."""
    found = doc.get("bisections") or []
    if not found:
        return []
    out = ["<h2 id='bisections'>Bisections</h2><table class='failures'>"]
    out.append("<tr><th>cell</th><th>over</th><th>found</th><th>probes</th><th>issue body</th></tr>")
    for b in found:
        issue = f"<a href={_q(link(b['issue']))}>issue</a>" if b.get("issue") else ""
        out.append(
            f"<tr><td>{_e(b['cell'])}</td><td>{_e(b['package'])}</td><td>{_e(b.get('found') or b.get('error'))}</td>"
            f"<td>{len(b.get('probes') or [])}</td><td>{issue}</td></tr>"
        )
    return out + ["</table>"]


def _changes(doc):
    if doc.get("compared_with") is None and not doc.get("comparison"):
        return []
    changes = doc.get("comparison") or {}
    out = [f"<h2 id='changes'>Changes since {_e(doc.get('compared_with') or 'the compared run')}</h2>"]
    if not changes:
        return out + ["<p>No cell changed.</p>"]
    out.append("<ul>")
    out.extend(
        f"<li>{MARKS.get(change, '')} {_e(change)}: <a href='#cell-{_e(k.split('::', 1)[-1])}'>{_e(k)}</a></li>"
        for k, change in changes.items()
    )
    return out + ["</ul>"]


def _run(run, changes, link):
    meta = run["meta"]
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items())
    out = [
        f"<h2>Profile {_e(meta.get('profile'))} — {_e(meta.get('matrix'))}</h2>",
        f"<p>target {_e(meta.get('target'))}, launcher {_e(meta.get('launcher'))}, tier "
        f"{_e(meta.get('tier', 'real'))}, {_e(versions)}, {_e(meta.get('date', ''))}{_e(where_line(meta))}; "
        f"{_e(summary_counts(run))}</p>",
    ]
    if note := trace_note(meta):
        out.append(f"<p><b>{_e(note)}</b></p>")
    if (meta.get("changed") or {}).get("not_gated"):
        out.append("<p><b>Not gated here</b>: changes no cell of this profile reaches (not a pass)</p><ul>")
        out += [f"<li>{_e(p)}: {_e(w)}</li>" for p, w in meta["changed"]["not_gated"].items()]
        out.append("</ul>")
    groups = features(run)
    if groups:
        out.append("<h3>Status by feature</h3>")
        for group, rows in groups:
            out.append(f"<p><b>{_e(group)}</b></p><ul>")
            for f in rows:
                links = ", ".join(f"<a href='{_e(url)}'>{_e(e)}</a>" for e, url in f.entries)
                out.append(
                    f"<li>[{_e(f.state)}] {_e(f.name)}: {_e(f.counts())}"
                    f"{'; known failures: ' + links if links else ''}</li>"
                )
            out.append("</ul>")
    combos = failing_combinations(run)
    if combos:
        out.append("<h3>Which combination fails</h3><ul>")
        apart = " (no passing cell tells them apart: what they share)"
        out.extend(
            f"<li><b>{_e(c.label())}</b>{'' if c.separated else apart}: "
            f"{plural(len(c.cells), 'cell')}{', known failure ' + _e(c.known) if c.known else ''}: "
            f"<code>{_e(c.signature[:200])}</code></li>"
            for c in combos
        )
        out.append("</ul>")
    models = {v.get("model", ""): [] for v in meta.get("valid", [])}
    for rec in run["cells"]:
        models.setdefault(rec["axes"].get("model", ""), []).append(rec)
    for model, cells in models.items():
        valid = sum(1 for v in meta.get("valid", []) if v.get("model", "") == model) or len(cells)
        out.append(f"<h3>{_e(model or meta.get('matrix'))}: {len(cells)} of {valid} valid cells run</h3>")
        headers, body = grid(
            model_grid(run, model, cells),
            every_row=True,
            cell=lambda rec: _cell(rec, link, changes.get(key(meta, rec))),
            na=_na,
            not_run=f"<span class='notrun' data-status='notrun' title='valid, not run this time'>{NOT_RUN}</span>",
        )
        out.append(tabulate(body, headers=headers, tablefmt="unsafehtml"))
    return out


def _na(rec):
    """A combination a rule rules out: its rule and reason on hover."""
    return f"<span class='na' title='{_e('n/a: rule ' + rec['rule'] + ': ' + rec['reason'])}'>n/a</span>"


def _cell(rec, link, change):
    status = status_of(rec)
    text = {
        Status.PASSED: "✅ pass",
        Status.FAILED: "❌ FAIL",
        Status.XFAILED: "🚧 xfail",
        Status.XPASSED: "⚠️ XPASS",
        Status.SKIPPED: "⏭️ skip",
        "flaky": "🔁 flaky",
    }.get(status, status)
    if rec.get("failure_class") and rec["status"] != Status.PASSED:
        text += f" {rec['failure_class']}"
    if rec.get("numerics") and rec["status"] == Status.PASSED:
        text += " ≡" if rec["numerics"]["max_abs_diff"] == 0 else " ≈"
    if rec.get("wall") and rec["status"] != Status.SKIPPED:
        text += f" {rec['wall']:.0f}s"
    title = rec.get("error_line") or rec.get("verdict") or ""
    return (
        f"<span class='{_e(rec['status'])}' data-status='{_e(status)}' title='{_e(title)}'>"
        f"<a href='#cell-{_e(rec['id'])}'>{_e(text)}</a>{MARKS.get(change or '', '')}</span>"
    )


def _details(rec, link, image):
    parts = [
        f"<li id='cell-{_e(rec['id'])}' class='{_e(rec['status'])}' data-status='{_e(status_of(rec))}'>"
        f"<b>{_e(rec['id'])}</b>: {_e(status_of(rec))}"
    ]
    if rec.get("failure_class"):
        rank = "" if rec.get("failing_rank") is None else f", first failing rank {rec['failing_rank']}"
        parts.append(f" [{_e(rec['failure_class'])}{_e(rank)}] <span class='error'>{_e(rec.get('error_line'))}</span>")
    if rec.get("verdict"):
        parts.append(f"<br>{_e(rec['verdict'])}")
    if rec.get("known_failure_link"):
        parts.append(f" (<a href='{_e(rec['known_failure_link'])}'>{_e(rec.get('known_failure'))}</a>)")
    parts.extend(f"<br>{_e(d)}" for d in rec.get("details") or ())
    if rec.get("numerics"):
        parts.append(f"<br>numerics: {_e(_numerics(rec['numerics']))}")
    if rec.get("evidence"):
        held = sum(1 for e in rec["evidence"] if e["ok"])
        shown = "; ".join(f"{e['axis']}: {'ok' if e['ok'] else 'NOT SHOWN'} ({e['seen']})" for e in rec["evidence"])
        parts.append(f"<br>evidence {held}/{len(rec['evidence'])}: {_e(shown)}")
    if rec.get("memory"):
        parts.append(f"<br>{_e(memory.detail(rec))}")
    if rec.get("invariants"):
        inv = rec["invariants"]
        parts.append(
            f"<br>optimizer-step invariants: {inv.get('steps')} steps on ranks {_e(inv.get('ranks'))}: "
            + _e(inv.get("violation") or "every one holds")
        )
    links = [
        f"<a href={_q(link(p))}>rank {_e(r)}</a>"
        for r, paths in (rec.get("rank_logs") or {}).items()
        for p in paths[:1]
    ]
    for label, field in (("result.json", "log_dir"), ("compile trace", "trace_html")):
        if rec.get(field):
            target = Path(rec[field]) / "result.json" if field == "log_dir" else rec[field]
            links.append(f"<a href={_q(link(target))}>{label}</a>")
    if links:
        parts.append("<br>logs: " + " · ".join(links))
    if rec.get("plot"):
        parts.append("<br>" + _img(rec["plot"], "loss and grad-norm curves", link, image))
    if rec.get("reproducer"):
        parts.append(f"<details><summary>reproducer</summary><pre>{_e(rec['reproducer'])}</pre></details>")
    parts.append("</li>")
    return "".join(parts)


def _numerics(n):
    out = (
        f"lane {n.get('lane')} vs {n.get('baseline')}: max |diff| {n.get('max_abs_diff', 0):.3g}, max rel "
        f"{n.get('max_rel_diff', 0):.3g}, steps off {n.get('missed_steps')}"
    )
    params = n.get("params")
    if isinstance(params, dict):
        first = params.get("first_difference")
        out += f"; per parameter: {params.get('checked')} compared, first difference " + (
            f"{first['param']} ({first['kind']}, step {first['step']})" if first else "none"
        )
    if n.get("noise"):  # its lane's tolerances, not its layout's measured noise: unmeasured here, or measured elsewhere
        out += f"; tolerances {n['noise']}"
    return out


def _img(path, alt, link, image):
    src = image(path) if image else link(path)
    return f"<img src={_q(src)} alt='{_e(alt)}' width='600'>" if src else ""


def _inline(path):
    """A PNG as a data URI (the self-contained page carries its images)."""
    try:
        return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()
    except OSError:
        return None


def _e(text):
    return html.escape(str(text if text is not None else ""))


def _q(url):
    """A URL as a quoted attribute value."""
    return f"'{html.escape(str(url), quote=True)}'"


def _linker(folder: Path):
    """A path as a link relative to the page (the page and the run folder can move together)."""
    base = Path(folder).resolve()

    def link(target):
        return Path(os.path.relpath(Path(target).resolve(), base)).as_posix()

    return link


def main_log(rec):
    """The log a person opens first: the failing rank's, else rank 0's, else the cell's folder."""
    logs = rec.get("rank_logs") or {}
    rank = str(rec["failing_rank"]) if rec.get("failing_rank") is not None else "0"
    paths = logs.get(rank) or next(iter(logs.values()), None)
    return paths[0] if paths else (rec.get("log_dir") or None)
