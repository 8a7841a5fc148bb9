"""The update command (``--simplefsdp-update-known-failures``): the known-failures file rewritten from a run, as a
person would edit it."""

from __future__ import annotations

import io
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from ..kinds import KnownKind
from ..spec.cells import value_id
from .combination import needs
from .known import COMMIT_KEY, TODO_LINK, commit_scope, signature


@dataclass
class Draft:
    """One new entry, as a person writes one per bug: the failures of one signature in one profile, and the axis
    values they need (judge.combination: what they share and no passing cell has), not every axis of a cell."""

    profile: str
    results: list  # the CellResults failing with it
    when: list  # [(axis, value or [values])]

    @property
    def id(self):
        def part(axis, value):
            values = value if isinstance(value, list) else [value]
            text = "_".join(value_id(v) for v in values)
            return text if all(isinstance(v, str) for v in values) else f"{axis}{text}"

        return "-".join([self.profile, *(part(a, v) for a, v in self.when)])


def drafts(profile, failing, passing_axes) -> list[Draft]:
    """The new failures of a profile grouped by signature (and flakiness), each with the values it needs against
    the axes of the profile's passing cells."""
    groups: dict = {}
    for r in failing:
        groups.setdefault((r.signature or "", bool(r.flaky)), []).append(r)
    return [
        Draft(profile, results, needs([r.axes for r in results], passing_axes).values) for results in groups.values()
    ]


def update_file(path, new_failures, passing_entries, date, check=None, windows=None, reasons=None):
    """Update a known-failures file as a person would edit it: every untouched line stays byte for byte (quoting,
    comments, blank lines, order), and the result must load again.

    ``new_failures``: Drafts (see ``drafts``) of failures no entry explained, one per signature. A draft whose
    entry (the id this update gives it, from the values it needs) exists and expects another error gets that
    entry's ``error`` replaced (a changed signature); any other becomes a new entry at the end with the placeholder
    link (known.TODO_LINK: it loads with a warning until
    it names the upstream issue). ``passing_entries``: ids of xfail entries all of whose cells passed: removed with
    the comment lines directly above them, unless those are the file's header (the comments before its first entry)
    or a section heading (a comment block set apart by a blank line). The new text is written to a temporary file,
    loaded back with ``check(path)`` (a MatrixError if it would not load), and only then renamed over the old one.
    ``windows``: entry id -> {first_failing|last_passing|fixed_in: {package: version}} found by a bisection or a twin
    run, written into that entry (or into the new entry of that id). A new failure that passed in one of its
    confirming runs is added as ``kind: flaky`` with its ``pass_rate``. ``reasons``: entry id -> a sentence (the
    compiler step a bisection named) that ends that entry's reason (replacing one it wrote before: it starts with
    the same words up to its first parenthesis or colon). Returns the lines to report."""
    windows, path, reasons = dict(windows or {}), Path(path), dict(reasons or {})
    dumper = YAML(typ="rt")
    dumper.indent(mapping=2, sequence=2, offset=0)
    dumper.width = 4096
    changes = []
    doc, lines, spans, ids = _windowed(
        path.read_text() if path.exists() else "", windows, passing_entries, dumper, changes
    )
    for eid in [e for e in reasons if e in ids and e not in passing_entries]:
        sentence = reasons.pop(eid)
        lines = _set_reason(lines, spans[ids[eid]], doc[ids[eid]].get("reason") or "", sentence)
        changes.append(f"reason of {eid} now ends: {sentence}")
        doc, lines, spans, ids = _parsed("".join(lines))
    drop = _passing(lines, spans, ids, passing_entries, changes)
    _drafted(lines, doc, spans, ids, new_failures, windows, date, dumper, changes, reasons)
    if not changes:  # nothing to say: the file stays as it is, byte for byte
        return changes
    text = "".join(line for n, line in enumerate(lines) if n not in drop)
    if not _parsed(text)[0]:  # every entry went: still a list (comments kept)
        text += ("" if not text or text.endswith("\n") else "\n") + "[]\n"
    _replace(path, text, check)
    return changes


def _windowed(text, windows, passing_entries, dumper, changes):
    """Phase 1: each window found for an entry of the file (that stays) written into it, taken out of ``windows``;
    the text parsed again after each. Returns _parsed's (doc, lines, spans, ids) of the result."""
    doc, lines, spans, ids = _parsed(text)
    for eid in [e for e in windows if e in ids and e not in passing_entries]:
        window = windows.pop(eid)
        lines = _set_window(lines, spans[ids[eid]], window, dumper)
        changes.append(f"window of {eid}: " + "; ".join(f"{k} {v}" for k, v in window.items()))
        doc, lines, spans, ids = _parsed("".join(lines))
    return doc, lines, spans, ids


def _passing(lines, spans, ids, passing_entries, changes) -> set:
    """Phase 2: the line numbers of the entries whose cells all passed, with their own comment lines above."""
    drop: set = set()
    for eid in passing_entries:
        if eid in ids:
            first, last = spans[ids[eid]]
            above = first
            while above > 0 and lines[above - 1].lstrip().startswith("#"):
                above -= 1
            if ids[eid] > 0:  # (the comments before the first entry are the file's header: they stay)
                first = above  # the entry's own comment
            drop.update(range(first, last + 1))
            changes.append(f"removed {eid}: every cell it covers passed")
    return drop


def _drafted(lines, doc, spans, ids, new_failures, windows, date, dumper, changes, reasons):
    """Phase 3, in ``lines``: each draft's entry's error replaced where the entry exists and expects another one
    (a changed signature), else a new entry appended (with the window and reason sentence found for it or one of its
    cells)."""
    added = []
    for draft in new_failures:
        result = draft.results[0]
        eid = draft.id
        while eid in added:  # (two signatures that need the same values)
            eid = f"{eid}-{len(added) + 1}"
        # the pattern is searched in the normalised text (known.signature), not in the identity the drafts group by
        pattern = _escape(" ".join(signature(result.error_text or result.error_line).split(" ")[:12]))
        if eid in ids:
            first, last = spans[ids[eid]]
            at = next((n for n in range(first, last + 1) if re.match(r"\s*(- )?error:", lines[n])), None)
            if at is None or doc[ids[eid]].get("error") == pattern:
                continue
            indent = re.match(r"\s*(- )?", lines[at]).group(0)
            lines[at] = f"{indent}error: {_scalar(dumper, pattern)}  # signature changed {date}\n"
            changes.append(f"changed signature: {eid} now expects /{pattern}/ (was /{doc[ids[eid]].get('error')}/)")
            continue
        keys = [eid, *(f"{draft.profile}-{r.id}" for r in draft.results)]  # (the entry's, else one of its cells')
        window = next((windows.pop(k) for k in keys if k in windows), {})
        sentence = next((reasons.pop(k) for k in keys if k in reasons), "")
        added.append(eid)
        out = io.StringIO()
        entry = _new_entry(draft, eid, pattern, window, date)
        if sentence:
            entry["reason"] = f"{entry['reason']} {sentence}"
        dumper.dump([entry], out)
        lines.append(("" if not lines or lines[-1].endswith("\n") else "\n") + out.getvalue())
        changes.append(
            f"added {eid} for {_cells(len(draft.results))} (link: {TODO_LINK!r}: name it; the file loads "
            f"with a warning until then)"
        )


def _new_entry(draft, eid, pattern, window, date) -> CommentedMap:
    """A draft's new entry: its values, its error, xfail (flaky with its pass rate where a confirming run passed),
    the placeholder link, a reason that names its cells, and its window."""
    result = draft.results[0]
    # a window says on which versions it fails: the version set the cell ran on is then no condition of its own
    when = CommentedMap([("profile", draft.profile)])
    for axis, value in draft.when:
        if not (window and axis == "versions"):
            when[axis] = _flow(CommentedSeq(value)) if isinstance(value, list) else value
    if commit_scope(window):  # a window over torchtitan commits: the entry holds from (or until) that commit
        when[COMMIT_KEY] = commit_scope(window)
    when.fa.set_flow_style()
    rates = [(r.confirm or {}).get("pass_rate") for r in draft.results if r.flaky]
    rate = rates[0] if rates and rates[0] is not None else None
    cells = ", ".join(r.id for r in draft.results)
    entry = CommentedMap(
        [
            ("id", eid),
            ("when", when),
            ("error", pattern),
            ("kind", str(KnownKind.FLAKY if rate is not None else KnownKind.XFAIL)),
            *([("pass_rate", rate)] if rate is not None else []),
            ("link", TODO_LINK),
            (
                "reason",
                f"{result.failure_class}: "
                f"{(result.error_line or '')[:160]} (first seen {date}; "
                f"{_cells(len(draft.results))}: {cells[:300]})",
            ),
        ]
    )
    for key, value in window.items():
        entry[key] = _flow(CommentedMap(value))
    return entry


def _flow(node):
    node.fa.set_flow_style()
    return node


def _cells(n):
    return f"{n} cell{'' if n == 1 else 's'}"


def _parsed(text):
    """(document, lines, (first, last) line of each entry, entry id -> index) of a known-failures text."""
    doc = YAML(typ="rt").load(text) if text.strip() else None
    doc = doc if doc is not None else []
    lines = text.splitlines(keepends=True)
    if not doc:
        lines = _without_empty_flow_list(lines)  # `[]`: the entries go where it stood, as a block list
    return doc, lines, _entry_spans(lines, [e.lc.line for e in doc]), {e.get("id"): i for i, e in enumerate(doc)}


def _set_window(lines, span, window, dumper):
    """Set the window keys of the entry at ``span``: a line of each replaced where it exists, else added at its end."""
    first, last = span
    indent = "  "
    for key, value in window.items():
        flow = CommentedMap(value)
        flow.fa.set_flow_style()
        text = f"{indent}{key}: {_scalar(dumper, flow)}\n"
        at = next((n for n in range(first, last + 1) if re.match(rf"\s*(- )?{key}:", lines[n])), None)
        if at is not None:
            lines[at] = text
        else:
            lines.insert(last + 1, text)
            last += 1
    return lines


def _set_reason(lines, span, reason, sentence):
    """End the entry's reason with ``sentence``: a folded block's lines stay as they are, the sentence's lines are
    added after them (one it wrote before, on lines of its own starting with the same words up to its first
    parenthesis or colon, replaced); a one-line reason becomes a folded block."""
    first, last = span
    at = next((n for n in range(first, last + 1) if re.match(r"\s*(- )?reason:", lines[n])), None)
    lead = re.split(r"[(:]", sentence, maxsplit=1)[0].strip()
    if at is None:  # (no reason yet)
        return lines[: last + 1] + ["  reason: >-\n", *_folded(sentence, "    ")] + lines[last + 1 :]
    end = at + 1
    while end <= last and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > 2):
        end += 1  # (the block's lines: indented deeper than the entry's keys)
    if re.match(r"\s*(- )?reason:\s*[>|][-+]?\s*$", lines[at]) and end > at + 1:
        kept = lines[at + 1 : end]
        cut = next((i for i, line in enumerate(kept) if line.strip().startswith(lead)), len(kept))
        indent = kept[0][: len(kept[0]) - len(kept[0].lstrip())]
        return lines[: at + 1] + kept[:cut] + _folded(sentence, indent) + lines[end:]
    kept = str(reason).split(f" {lead}")[0].strip() if not str(reason).startswith(lead) else ""
    return lines[:at] + ["  reason: >-\n", *_folded(f"{kept} {sentence}".strip(), "    ")] + lines[end:]


def _folded(text, indent) -> list[str]:
    """Lines of a folded block (a path or name is never split: folding would join its halves with a space)."""
    return [f"{indent}{w}\n" for w in textwrap.wrap(text, 110, break_on_hyphens=False, break_long_words=False)]


def _without_empty_flow_list(lines):
    """The lines of a file whose document is an empty list written ``[]``, without that ``[]`` (comments stay)."""
    out = []
    for line in lines:
        body, hash_, comment = line.partition("#")
        if body.strip() == "[]":
            line = (hash_ + comment) if hash_ else ""
        out.append(line)
    return [line for line in out if line]


def _replace(path: Path, text: str, check):
    """Write ``text`` to a temporary file beside ``path``, load it back, then rename it over ``path``: a text that
    would not load never replaces the old file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        YAML(typ="rt").load(text)  # (valid YAML first: a MatrixError from check names the entry)
        if check:
            check(tmp)
    except Exception:
        tmp.unlink()
        raise
    os.replace(tmp, path)


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
