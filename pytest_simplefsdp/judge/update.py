"""The update command (``--simplefsdp-update-known-failures``): the known-failures file rewritten from a run, as a
person would edit it."""

from __future__ import annotations

import io
import re
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap


def update_file(path, new_failures, passing_entries, date):
    """Update a known-failures file in place, as a person would edit it: every untouched line stays byte for
    byte (quoting, comments, order).

    ``new_failures``: (profile, CellResult) of failures no entry explained. A cell whose own entry (the id this
    update gives it) expects another error gets that entry's ``error`` replaced (a changed signature); any
    other becomes a new entry at the end with ``link: TODO``. ``passing_entries``: ids of xfail entries all of
    whose cells passed: removed with the comment lines directly above them (a comment block set apart by a
    blank line is a section heading and stays). Returns the lines to report."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    doc = YAML(typ="rt").load(text) if text.strip() else None
    doc = doc if doc is not None else []
    lines = text.splitlines(keepends=True)
    spans = _entry_spans(lines, [e.lc.line for e in doc])
    ids = {e.get("id"): i for i, e in enumerate(doc)}
    drop, changes, added = set(), [], []
    for eid in passing_entries:
        if eid in ids:
            first, last = spans[ids[eid]]
            while first > 0 and lines[first - 1].lstrip().startswith("#"):
                first -= 1  # the entry's own comment
            drop.update(range(first, last + 1))
            changes.append(f"removed {eid}: every cell it covers passed")
    dumper = YAML(typ="rt")
    dumper.indent(mapping=2, sequence=2, offset=0)
    dumper.width = 4096
    for profile, result in new_failures:
        eid = f"{profile}-{result.id}"
        pattern = _escape(" ".join((result.signature or "").split(" ")[:12]))
        if eid in ids:
            first, last = spans[ids[eid]]
            at = next((n for n in range(first, last + 1) if re.match(r"\s*(- )?error:", lines[n])), None)
            if at is None or doc[ids[eid]].get("error") == pattern:
                continue
            indent = re.match(r"\s*(- )?", lines[at]).group(0)
            lines[at] = f"{indent}error: {_scalar(dumper, pattern)}  # signature changed {date}\n"
            changes.append(f"changed signature: {eid} now expects /{pattern}/ (was /{doc[ids[eid]].get('error')}/)")
            continue
        if eid in added:
            continue
        when = CommentedMap([("profile", profile), *result.axes.items()])
        when.fa.set_flow_style()
        entry = CommentedMap([("id", eid), ("when", when), ("error", pattern), ("kind", "xfail"),
                              ("link", "TODO"), ("reason", f"{result.failure_class}: "
                                                           f"{(result.error_line or '')[:160]} (first seen {date})")])
        added.append(eid)
        out = io.StringIO()
        dumper.dump([entry], out)
        lines.append(("" if not lines or lines[-1].endswith("\n") else "\n") + out.getvalue())
        changes.append(f"added {eid} (link: TODO; fill it in before the file loads again)")
    path.write_text("".join(line for n, line in enumerate(lines) if n not in drop))
    return changes


def _escape(text):
    """A literal as a regex, spaces left readable (re.escape writes them as "\\ ")."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def _entry_spans(lines, starts):
    """(first, last) line of each top-level entry: from its line to its last line that is not blank or a comment
    (comments after an entry belong to what follows it)."""
    spans = []
    for i, first in enumerate(starts):
        last = (starts[i + 1] if i + 1 < len(starts) else len(lines)) - 1
        while last > first and (not lines[last].strip() or lines[last].lstrip().startswith("#")):
            last -= 1
        spans.append((first, last))
    return spans


def _scalar(dumper, value):
    out = io.StringIO()
    dumper.dump(value, out)
    return out.getvalue().splitlines()[0].removesuffix(" ...").strip()
