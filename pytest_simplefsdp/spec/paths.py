"""Which cells a change can reach (--simplefsdp-changed): a target's map of torchtitan paths to the cells a change
there can reach, kept as data (``matrix/paths/<target>.yaml``), as torchtitan's own CI narrows jobs by path filters.

Each rule is a glob of paths relative to the checkout's root (``*`` also crosses folders) and what it reaches:
``all``, ``none``, or partial cells (an axis takes a value or any of a list). The first rule that matches a path
decides it; a path no rule matches reaches every cell, so an unknown corner of torchtitan is never skipped."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import MATRIX_DIR
from ..yamlio import MatrixError, line_of, load_yaml, plain

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
    """What a change reaches: each changed file's deciding rule (None: unmapped, every cell)."""

    files: dict = field(default_factory=dict)  # path -> PathRule | None

    def reaches(self, axes: dict) -> bool:
        return any(rule is None or rule.reaches_cell(axes) for rule in self.files.values())

    def why(self) -> dict:
        """path -> what its rule says it reaches, and why (for the header and the JSON)."""
        return {
            f: UNMAPPED if r is None else f"{describe(r.reaches)} ({r.why}; {r.where})" for f, r in self.files.items()
        }


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


def select(rules: list[PathRule], files) -> Selection:
    """Each changed file's deciding rule: the first whose glob matches it, else None (every cell)."""
    return Selection({f: next((r for r in rules if fnmatch.fnmatchcase(f, r.path)), None) for f in files})
