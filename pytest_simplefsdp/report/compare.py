"""A run compared with an older one (--simplefsdp-compare, the report tool's --compare): the cells that broke, got
fixed, or fail with another signature, matched by profile and cell id."""

from __future__ import annotations

from ..spec.cells import cell_key
from .tables import broken, rec_signature

MARKS = {"newly broken": "🆕", "newly fixed": "🎉", "changed signature": "🔀"}


def key(meta, rec):
    """A stored cell's key across runs (spec.cells.cell_key)."""
    return cell_key(meta.get("profile"), meta.get("tier", "real"), rec["id"])


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
        elif was and now and rec_signature(before) != rec_signature(rec):
            changes[k] = "changed signature"
    return changes


def change_lines(changes):
    """(text, is_good) per change, for the terminal and the report tool alike."""
    return [(f"{change}: {k}", change == "newly fixed") for k, change in changes.items()] or [("no cell changed", True)]
