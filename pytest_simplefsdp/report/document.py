"""The run's document, what --simplefsdp-json writes and the status markdown, the page and the report hook read:
the store's records (store.results) with what the run adds up from them, built here once, for the live session
and for the report tool alike: the seed checkpoints its cells started from, the launcher incidents, the comparison
with an older run, the PR gate's block, the twin pairs and the bisections. The terminal only prints it."""

from __future__ import annotations

from ..versions.sets import INSTALLED
from .compare import compare_runs
from .gate import gate
from .twin import twins


def complete(
    doc: dict,
    *,
    seeds: dict | None = None,
    incidents=(),
    compared=None,
    twin: str | None = None,
    installed: str = "",
    bisections: list | None = None,
) -> dict:
    """``doc`` with its sections: ``seeds`` {matrix: seed records}, ``compared`` (what, the older document),
    ``twin`` the second version set's label (``installed``: the first one's words), ``bisections`` their records.
    The gate's block is summed up from the cells as they are judged now (a re-judged run's block says what its
    cells say); a section that has nothing is left out."""
    for run_doc in doc["runs"]:
        kept = (seeds or {}).get(run_doc["meta"].get("matrix"))
        if kept:
            run_doc["seeds"] = kept
    if incidents:
        doc["incidents"] = list(incidents)
    if compared is not None:
        against, old = compared
        doc["comparison"], doc["compared_with"] = compare_runs(old, doc), str(against)
    pr = gate(doc)
    if pr is not None:
        doc["gate"] = pr
    else:
        doc.pop("gate", None)
    if twin:
        doc["twin"] = [twin_block(run_doc, installed, twin) for run_doc in doc["runs"]]
    if bisections is not None:
        doc["bisections"] = bisections
    return doc


def twin_block(run_doc: dict, first: str, second: str) -> dict:
    """A profile's twin pairs: each cell's verdict on both version sets, their numerics and whether they differ."""
    pairs = twins(run_doc, INSTALLED, second)
    return {
        "profile": run_doc["meta"].get("profile"),
        "first": first,
        "second": second,
        "pairs": [
            {
                "cell": t.cell,
                "first": t.a["status"],
                "second": t.b["status"],
                "numerics": t.numerics(),
                "differs": t.differs(),
                "walls": [t.a.get("wall"), t.b.get("wall")],
            }
            for t in pairs
        ],
    }
