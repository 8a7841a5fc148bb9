"""A run compared with an older one (--simplefsdp-compare, the report tool's --compare): the cells that broke, got
fixed, or fail with another signature, matched by profile and cell id. A known flaky cell is never newly broken or
fixed: its flip between passing and failing is a change of its own."""

from __future__ import annotations

from ..kinds import Change
from ..spec.cells import cell_key
from .tables import broken, rec_signature

MARKS = {Change.NEWLY_BROKEN: "🆕", Change.NEWLY_FIXED: "🎉", Change.CHANGED_SIGNATURE: "🔀", Change.FLAKY_FLIP: "🔁"}
GOOD = {Change.NEWLY_FIXED}


def key(meta, rec):
    """A stored cell's key across runs (spec.cells.cell_key)."""
    return cell_key(meta.get("profile"), meta.get("tier", "real"), rec["id"])


def compare_runs(old_doc, new_doc):
    """{key: Change word} between two runs (cells in both that ran in both; see ``key``)."""

    def index(doc):
        return {key(run["meta"], rec): rec for run in doc["runs"] for rec in run["cells"]}

    old, changes = index(old_doc), {}
    for k, rec in index(new_doc).items():
        before = old.get(k)
        was, now = (None, None) if before is None else (broken(before), broken(rec))
        if was is None or now is None:
            continue
        if was != now and (rec.get("flaky") or before.get("flaky")):
            changes[k] = str(Change.FLAKY_FLIP)
        elif now and not was:
            changes[k] = str(Change.NEWLY_BROKEN)
        elif was and not now:
            changes[k] = str(Change.NEWLY_FIXED)
        elif was and now and rec_signature(before) != rec_signature(rec):
            changes[k] = str(Change.CHANGED_SIGNATURE)
    return changes


def change_lines(changes):
    """(text, is_good) per change, for the terminal and the report tool alike."""
    return [(f"{change}: {k}", Change(change) in GOOD) for k, change in changes.items()] or [("no cell changed", True)]
