"""The status by feature: what the hand-kept status checklist said, rolled up from a run's cells."""

from __future__ import annotations

from .tables import broken


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
