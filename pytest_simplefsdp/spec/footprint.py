"""Which cells a change can reach, from what the cells ran (--simplefsdp-changed where footprints are kept): a
cell's footprint (the torchtitan files its ranks imported, opened or listed, and per Python file the functions that
ran: shim/footprint.py records it, store/footprints.py keeps it per torchtitan commit) against a diff's changes
(each changed file at its old and new name, and the functions whose bodies changed, from ``git diff -U0``).

A change reaches a cell when it touches a file in the footprint and, in a Python file, changes the body of a
function that ran there; a changed signature, decorator, class body or module-level statement, a file added,
deleted or renamed, or one that does not parse counts for the whole file. A footprint is sound for the commit it
was made on: a diff is taken from that commit (the nearest kept one before the base), so anything that would make
the cell run other code is itself a change to code it ran."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

RANK_FILE = re.compile(r"^footprint\.rank(\d+)\.json$")


@dataclass(frozen=True)
class Footprint:
    files: frozenset  # rel paths of the checkout's files the ranks executed, imported or opened
    functions: dict = field(default_factory=dict)  # python rel path -> frozenset of the qualnames that ran
    complete: bool = True  # False: the functions are a floor (dynamo compiled; this torch says not what it inlined)
    listed: frozenset = frozenset()  # folders the ranks listed: a file in one (added, removed, renamed) counts
    trees: frozenset = frozenset()  # files and folders the command names: anything under one counts

    def touches(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        return (
            path in self.files
            or parent in self.listed
            or any(path == t or path.startswith(t + "/") for t in self.trees)
        )

    def ran(self, path: str, unit: str) -> bool:
        """Whether the function ``unit`` (or code nested in it) of ``path`` ran."""
        names = self.functions.get(path, ())
        return unit in names or any(q.startswith(unit + ".") for q in names)

    def to_json(self) -> dict:
        return {
            "files": sorted(self.files),
            "functions": {f: sorted(q) for f, q in sorted(self.functions.items())},
            "complete": self.complete,
            "listed": sorted(self.listed),
            "trees": sorted(self.trees),
        }

    @classmethod
    def from_json(cls, doc: dict) -> Footprint:
        return cls(
            frozenset(doc.get("files", ())),
            {f: frozenset(q) for f, q in (doc.get("functions") or {}).items()},
            bool(doc.get("complete", True)),
            frozenset(doc.get("listed", ())),
            frozenset(doc.get("trees", ())),
        )


def of_ranks(folder: Path, world: int, named=()) -> Footprint | None:
    """The union of a run's ranks' footprints (shim/footprint.py), with the paths its command names as trees; None
    where a rank wrote none (it died before its end: what it would have run is unknown)."""
    docs = {}
    for path in Path(folder).glob("footprint.rank*.json"):
        m = RANK_FILE.match(path.name)
        if not m:
            continue
        try:
            docs[int(m[1])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    if not docs or set(range(world)) - set(docs):
        return None
    return union([Footprint.from_json(d) for d in docs.values()] + [Footprint(frozenset(), trees=frozenset(named))])


def union(prints) -> Footprint:
    """One footprint of several runs of a cell (its steps before it, its later runs)."""
    prints = list(prints)
    functions = {}
    for p in prints:
        for f, names in p.functions.items():
            functions[f] = functions.get(f, frozenset()) | names
    return Footprint(
        frozenset().union(*(p.files for p in prints)),
        functions,
        all(p.complete for p in prints),
        frozenset().union(*(p.listed for p in prints)),
        frozenset().union(*(p.trees for p in prints)),
    )


@dataclass(frozen=True)
class FileChange:
    """One changed file of a diff: its new path and old path (None: added / deleted), and what of it changed."""

    path: str | None  # None: deleted
    old_path: str | None  # None: added
    whole: bool  # the whole file counts (not Python, added, deleted, renamed, module level, unparsable)
    units: frozenset = frozenset()  # the functions whose bodies changed (their qualnames), where not whole

    @property
    def names(self) -> list[str]:
        return [p for p in dict.fromkeys((self.old_path, self.path)) if p]

    def why(self) -> str:
        if self.path is None:
            return "deleted"
        if self.old_path is None:
            return "added"
        if self.old_path != self.path:
            return f"renamed from {self.old_path}"
        if self.whole:
            return "changed at module level" if self.path.endswith(".py") else "changed"
        return "changed in " + ", ".join(sorted(self.units)) if self.units else "changed (no code)"


def reaches(fp: Footprint, change: FileChange) -> bool:
    if not any(fp.touches(p) for p in change.names):
        return False
    if change.whole or not fp.complete:
        return True
    return any(fp.ran(p, unit) for p in change.names for unit in change.units)


# --- a diff's changed functions ---------------------------------------------------------------------------------

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class _Scope:
    qualname: str | None  # None: module level or a class body (the whole file)
    body: tuple  # (first, last) line of the function's body
    children: list


def scopes(text: str) -> list | None:
    """The functions of a module, nested, each with its body's lines; None where it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None

    def walk(node, prefix, in_function):
        out = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                first = child.body[0].lineno
                out.append(_Scope(name, (first, child.end_lineno), walk(child, name + ".<locals>.", True)))
            elif isinstance(child, ast.ClassDef):
                out.append(_Scope(None, (0, -1), walk(child, prefix + child.name + ".", in_function)))
            else:
                out.extend(walk(child, prefix, in_function))
        return out

    return walk(tree, "", False)


def unit_of(tree: list, line: int) -> str | None:
    """The innermost function whose body holds ``line`` (None: module level, a class body, a signature or a
    decorator at module level)."""
    found = None
    for scope in tree:
        inner = unit_of(scope.children, line)
        if inner is not None:
            return inner
        if scope.qualname and scope.body[0] <= line <= scope.body[1]:
            found = scope.qualname
    return found


def changed_units(old_text: str | None, new_text: str | None, hunks) -> tuple[bool, frozenset]:
    """(whole, units) of a modified Python file from its ``git diff -U0`` hunks ((old start, old count, new start,
    new count), each): the lines removed are placed in the old text, the lines added in the new."""
    old, new = scopes(old_text or ""), scopes(new_text or "")
    if old is None or new is None:
        return True, frozenset()
    units = set()
    for a, b, c, d in hunks:
        for tree, start, count in ((old, a, b), (new, c, d)):
            for line in range(start, start + count):
                unit = unit_of(tree, line)
                if unit is None:
                    return True, frozenset()
                units.add(unit)
    return False, frozenset(units)


def parse_diff(text: str):
    """``git diff -M -U0`` (no colour) -> [(old path or None, new path or None, [hunks], binary)]."""
    out = []
    for block in re.split(r"^diff --git ", text, flags=re.M)[1:]:
        lines = block.splitlines()
        old = new = None
        hunks, binary, added, deleted = [], False, False, False
        for line in lines[1:]:
            if line.startswith("--- "):
                old = None if line == "--- /dev/null" else line[4:].removeprefix("a/")
            elif line.startswith("+++ "):
                new = None if line == "+++ /dev/null" else line[4:].removeprefix("b/")
            elif line.startswith("rename from "):
                old = line[len("rename from ") :]
            elif line.startswith("rename to "):
                new = line[len("rename to ") :]
            elif line.startswith("new file mode"):
                added = True
            elif line.startswith("deleted file mode"):
                deleted = True
            elif line.startswith("Binary files"):
                binary = True
            else:
                m = HUNK.match(line)
                if m:
                    hunks.append((int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)))
        if old is None and new is None:  # a mode change only: its paths from the header
            m = re.match(r"a/(.*) b/(.*)$", lines[0])
            old = new = m[2] if m else None
        out.append((None if added else old, None if deleted else new, hunks, binary))
    return out


def file_changes(diff_text: str, old_source, new_source, untracked=()) -> list[FileChange]:
    """The changes of a diff; ``old_source(path)`` / ``new_source(path)`` read a file's two sides (None: absent)."""
    out = []
    for old, new, hunks, binary in parse_diff(diff_text):
        python = (new or old or "").endswith(".py")
        if old is None or new is None or old != new or binary or not python:
            out.append(FileChange(new, old, True))
            continue
        whole, units = changed_units(old_source(old), new_source(new), hunks)
        out.append(FileChange(new, old, whole, units))
    return out + [FileChange(p, None, True) for p in untracked]
