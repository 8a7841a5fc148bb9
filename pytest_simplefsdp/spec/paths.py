"""Which cells a change can reach (--simplefsdp-changed): what the cells ran where their footprints are kept
(spec.footprint), and a target's map of torchtitan paths to the cells a change there can reach, kept as data
(``matrix/paths/<target>.yaml``), as torchtitan's own CI narrows jobs by path filters: the rule where a cell has no
footprint, and for files that are not Python.

Each rule is a glob of paths relative to the checkout's root (``*`` also crosses folders) and what it reaches:
``all``, ``none``, or partial cells (an axis takes a value or any of a list). The first rule that matches a path
decides it; a path no rule matches reaches every cell, so an unknown corner of torchtitan is never skipped."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import MATRIX_DIR
from ..yamlio import MatrixError, line_of, load_yaml, plain
from . import footprint

ALL, NONE = "all", "none"
UNMAPPED = "no rule maps it: every cell (the safe default)"


@dataclass(frozen=True)
class PathRule:
    path: str  # a glob
    reaches: object  # ALL, NONE, or a list of partial cells {axis: value or [values]}
    why: str
    where: str  # file:line

    def reaches_cell(self, axes: dict) -> bool:
        if self.reaches in (ALL, NONE):
            return self.reaches == ALL
        return any(
            all(axes.get(k) in (v if isinstance(v, list) else [v]) for k, v in part.items()) for part in self.reaches
        )


@dataclass
class Selection:
    """What a change reaches. Each changed file, at each of its names, has its deciding rule (None: unmapped, every
    cell); where a cell's footprint is kept (``prints``: cell id -> spec.footprint.Footprint, made on commit
    ``made_at``), a Python file reaches the cell by that footprint alone, any other file by the footprint or the rule.
    """

    changes: list  # spec.footprint.FileChange
    rules: dict  # path -> PathRule | None
    prints: dict = field(default_factory=dict)
    made_at: str | None = None

    def by_rule(self, change, axes) -> bool:
        return any(self.rules[n] is None or self.rules[n].reaches_cell(axes) for n in change.names)

    def reaches_by(self, change, cell_id, axes) -> str | None:
        """How ``change`` reaches the cell: "footprint", "map", or None."""
        fp = self.prints.get(cell_id)
        if fp is not None and footprint.reaches(fp, change):
            return "footprint"
        python = all(n.endswith(".py") for n in change.names)
        return "map" if (fp is None or not python) and self.by_rule(change, axes) else None

    def reaches(self, cell_id, axes) -> bool:
        return any(self.reaches_by(c, cell_id, axes) for c in self.changes)

    def mapped_none(self, change) -> bool:
        return all(self.rules[n] is not None and self.rules[n].reaches == NONE for n in change.names)

    def why(self, cells) -> tuple[dict, dict]:
        """({path: what it reaches among ``cells`` (id, axes) and why}, {path: why no cell here gates it}): a
        change that reaches none of this run's cells though its rule says it reaches some is not gated here."""
        said, not_gated = {}, {}
        for change in self.changes:
            name = change.path or change.old_path
            how = [self.reaches_by(change, cid, axes) for cid, axes in cells]
            rule = self.rules[name]
            ruled = UNMAPPED if rule is None else f"{describe(rule.reaches)} ({rule.why}; {rule.where})"
            ran, mapped = how.count("footprint"), how.count("map")
            if ran:
                said[name] = f"{ran} cells ran it ({change.why()})" + (
                    f"; {mapped} more by the map: {ruled}" if mapped else ""
                )
            elif mapped or self.mapped_none(change):
                said[name] = ruled
            else:
                ran = [cid for cid, _ in cells if cid in self.prints]
                not_gated[name] = (
                    f"no cell of this profile ran it ({change.why()}; footprints of {len(ran)} cells, made at "
                    f"{(self.made_at or '')[:12]}); map: {ruled}"
                    if ran
                    else f"the map says {ruled}: this profile has no such cell"
                )
                said[name] = "NOT GATED HERE: " + not_gated[name]
        return said, not_gated


def describe(reaches) -> str:
    if reaches in (ALL, NONE):
        return f"{reaches} cells" if reaches == ALL else "no cell"
    return (
        " or ".join(
            ", ".join(f"{k}={'|'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in part.items())
            for part in reaches
        )
        + " cells"
    )


def map_file(target_name: str) -> Path:
    return MATRIX_DIR / "paths" / f"{target_name}.yaml"


def load_rules(path, axes=None) -> list[PathRule]:
    """The rules of a path map; errors name the file, the line and the value. ``axes``: the axes the partial cells
    may name (None: any)."""
    doc = load_yaml(path)
    rules = doc.get("rules") if isinstance(doc, dict) else None
    if not isinstance(rules, list) or not rules:
        raise MatrixError(f"{path}: a path map is a mapping with `rules`: a list of {{path, reaches, why}}")
    out = []
    for i, node in enumerate(rules):
        where = line_of(path, rules, index=i)
        if (
            not isinstance(node, dict)
            or set(node) - {"path", "reaches", "why"}
            or "path" not in node
            or "reaches" not in node
            or not str(node.get("why") or "").strip()
        ):
            raise MatrixError(
                f"{where}: a rule is {{path: GLOB, reaches: all | none | [partial cells], why: TEXT}}, "
                f"got {plain(node)!r}"
            )
        reaches = plain(node["reaches"])
        if isinstance(reaches, dict):
            reaches = [reaches]
        if reaches not in (ALL, NONE) and not (
            isinstance(reaches, list) and reaches and all(isinstance(p, dict) and p for p in reaches)
        ):
            raise MatrixError(
                f"{where}: rule {node['path']!r}: reaches must be all, none or partial cells "
                f"({{axis: value or [values]}}), got {reaches!r}"
            )
        unknown = sorted({k for p in reaches for k in p} - set(axes)) if axes and isinstance(reaches, list) else []
        if unknown:
            raise MatrixError(
                f"{where}: rule {node['path']!r}: unknown axis {unknown[0]!r}; known: {', '.join(sorted(axes))}"
            )
        out.append(PathRule(str(node["path"]), reaches, str(node["why"]).strip(), where))
    return out


def select(rules: list[PathRule], changes, prints=None, made_at=None) -> Selection:
    """Each changed file's deciding rule, at each of its names: the first whose glob matches it, else None (every
    cell); with the footprints kept for the run's cells, where there are any."""
    names = {n for c in changes for n in c.names}
    found = {f: next((r for r in rules if fnmatch.fnmatchcase(f, r.path)), None) for f in names}
    return Selection(list(changes), found, dict(prints or {}), made_at)


def contradictions(rules: list[PathRule], prints: dict, axes_of: dict) -> list[str]:
    """Where a footprint contradicts the map: a file a cell ran or read whose rule says it cannot reach that cell."""
    out = []
    for cid, fp in sorted(prints.items()):
        for f in sorted(fp.files | set(fp.functions)):
            rule = next((r for r in rules if fnmatch.fnmatchcase(f, r.path)), None)
            if rule is not None and not rule.reaches_cell(axes_of[cid]):
                out.append(f"{cid} ran {f}, which {rule.where} maps to {describe(rule.reaches)} ({rule.why})")
    return out
