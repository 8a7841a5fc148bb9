"""Step 7 for a pull request (--simplefsdp-base): the failures sorted as Dr. CI sorts them (judge.gate), with both
sides' signatures, for the terminal, the JSON document, the status markdown and the page. Rendered from records."""

from __future__ import annotations

from ..judge.gate import ADDED, MEANING, ORDER, Base, legend, on_the_base, shut
from ..kinds import GateClass, RecordType

__all__ = ["MEANING", "ORDER", "gate", "headline", "legend", "numerics", "rows", "shut"]


def gate(doc: dict) -> dict | None:
    """{base, counts, failures: [{cell, class, here, base, verdict}]} of a run under --simplefsdp-base, else None."""
    base = next((r["meta"].get("base") for r in doc["runs"] if r["meta"].get("base")), None)
    if not base:
        return None
    failures = []
    for run_doc in doc["runs"]:
        for rec in run_doc["cells"]:
            if rec.get("gate") and rec.get("type", RecordType.CELL) == RecordType.CELL:
                added = rec["gate"] == GateClass.KNOWN and str(rec.get("verdict", "")).startswith(ADDED)
                theirs = on_the_base(rec["gate"], {**(rec.get("base") or {}), "added": added})
                failures.append(
                    {
                        "cell": f"{run_doc['meta']['profile']}::{rec['id']}",
                        "class": rec["gate"],
                        "here": rec.get("signature") or rec.get("error_line") or "",
                        "base": theirs,
                        "verdict": rec.get("verdict", ""),
                        "added": added,
                    }
                )
    failures.sort(key=lambda f: (ORDER.index(f["class"]), f["cell"]))
    counts = {str(c): sum(1 for f in failures if f["class"] == c) for c in ORDER}
    added = sum(1 for f in failures if f["added"])
    return {"base": base, "counts": counts, "added": added, "failures": failures, "numerics": numerics(doc)}


def numerics(doc: dict) -> dict:
    """--simplefsdp-base-numerics: {compared, changed: [{cell, line, beyond, size}]} of the passing smoke cells run
    on the base too (the cells that failed under ``fail`` included: they changed)."""
    compared, changed = 0, []
    for run_doc in doc["runs"]:
        for rec in run_doc["cells"]:
            other = rec.get("base_numerics")
            if not other or rec.get("type", RecordType.CELL) != RecordType.CELL:
                continue
            compared += other.get("changed") is not None
            if other.get("changed") is not False:
                changed.append(
                    {
                        "cell": f"{run_doc['meta']['profile']}::{rec['id']}",
                        "line": other.get("line"),
                        "beyond": bool(other.get("beyond")),
                        "size": other.get("size") or {},
                        "compared": other.get("changed") is not None,
                    }
                )
    return {"compared": compared, "changed": changed}


def numerics_lines(g: dict) -> list[str]:
    """The gate's numerics paragraph: how many smoke cells were compared with the base, each that changed."""
    n = g.get("numerics") or {}
    if not n.get("compared") and not n.get("changed"):
        return []
    moved = [c for c in n["changed"] if c["size"]]
    missed = sum(1 for c in n["changed"] if not c.get("compared", True))
    if n["compared"]:
        head = f"numerics vs the base: {len(moved)} of {n['compared']} passing smoke cell(s) compared changed" + (
            "" if moved else " (bit for bit the same)"
        )
    else:  # nothing was compared: nothing is said to be the same
        head = "numerics vs the base: no passing smoke cell could be compared"
    if missed:
        head += f"; {missed} could not be compared (it did not pass on the base)"
    return [head] + [f"  {c['cell']}: {c['line']}" for c in n["changed"]]


def headline(g: dict) -> str:
    counts = ", ".join(f"{n} {c}" for c, n in g["counts"].items())
    if g.get("added"):
        counts += f" ({g['added']} {ADDED})"
    return f"PR gate against base {Base(**g['base']).name()}: {counts}"


def rows(g: dict) -> list[tuple]:
    """(cell, class, signature here, the base's outcome) per failure, new ones first."""
    return [(f["cell"], f["class"], short(f["here"]), short(f["base"])) for f in g["failures"]]


def short(text: str, width=90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown(g: dict) -> list[str]:
    """The status markdown's section: headline, what each class means, the table."""
    lines = [f"### {headline(g)}", ""]
    lines += [f"- **{c}**: {MEANING[c]}" for c in g["counts"]]
    if g["failures"]:
        lines += ["", "| cell | class | signature here | on the base |", "|---|---|---|---|"]
        lines += [
            f"| `{f['cell']}` | {f['class']} | `{short(f['here']).replace('|', '/')}` | "
            f"{short(f['base']).replace('|', '/')} |"
            for f in g["failures"]
        ]
    extra = numerics_lines(g)
    if extra:
        lines += ["", f"**{extra[0]}**", ""] + [f"- {line.strip()}" for line in extra[1:]]
    return lines + [""]
