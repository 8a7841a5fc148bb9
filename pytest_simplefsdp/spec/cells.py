"""Step 2: expand a matrix into cells — cross product, exclude, include, rules, stable ids."""

from __future__ import annotations

import itertools
import math
import re
import shlex
from dataclasses import dataclass, replace

from ..versions.sets import INSTALLED, parse
from .matrix import RULE_FUNCTIONS, Matrix, MatrixError
from .upstream import upstream_axes


@dataclass(frozen=True)
class Passes:
    """The graph passes a compiler bisection's probe turns off (session.compiling): all of graph_trainer's optional
    ones (``every``: --compile.no_enable_passes) or the named ones (--compile.disable_passes)."""

    off: tuple[str, ...] = ()
    every: bool = False


@dataclass
class Cell:
    id: str
    axes: dict
    world: int
    smoke: bool = False
    where: str = ""  # the matrix line the cell came from (axes or an include entry)
    mutant: str | None = None  # the bug re-injected into this run of the cell (the mutation tier)
    passes: Passes | None = None  # graph passes a compiler bisection's probe turned off

    def attempt(self, name: str, **changes) -> "Cell":
        """The cell run once more as ``name`` (confirm2, a base or probe run, a baseline's retry): its id, and so
        its folder, ``<cell>/<name>``, beside its first run's."""
        return replace(self, id=f"{self.id}/{name}", **changes)

    def mutated(self, mutant: str) -> "Cell":
        """The cell with ``mutant`` re-injected (the mutation tier): ``<cell>[mutant-<name>]``."""
        return replace(self, id=f"{self.id}[mutant-{mutant}]", mutant=mutant)


def first_id(cell_id: str) -> str:
    """The id of the cell an attempt is of (``<cell>/confirm2`` -> ``<cell>``): its layout, its progress line."""
    return cell_id.split("/")[0]


@dataclass
class Dropped:
    id: str
    axes: dict
    world: int
    rule: str
    reason: str


def value_id(value):
    text = "none" if value is None else str(value)
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)


def id_parts(matrix: Matrix, axes: dict) -> dict:
    """axis -> how its value is written in ids and tables ("" where the matrix omits it)."""
    parts = {}
    for axis in matrix.axes:
        if axis == "versions":  # a version set: its slug, none for the environment pytest runs in
            vset = axes.get(axis, INSTALLED)  # (a record of a run without the axis ran on the installed versions)
            parts[axis] = "" if vset == INSTALLED else parse(vset).slug()
            continue
        spec = matrix.ids.get(axis, {})
        omit = spec.get("omit", [])
        omit = omit if isinstance(omit, list) else [omit]
        parts[axis] = "" if axes[axis] in omit else f"{spec.get('prefix', '')}{value_id(axes[axis])}"
    return parts


def cell_id(matrix: Matrix, axes: dict) -> str:
    return "-".join(p for p in id_parts(matrix, axes).values() if p)


def named_by(matrix: Matrix, cell: Cell) -> set:
    """The ids that name a cell on the command line: its own (a mutant's without its suffix), and, for a cell of a
    version set (a twin or --simplefsdp-versions run), the installed cell's id too: a cell named with a version set
    means that cell on every set."""
    own = cell.id.split("[mutant-")[0]
    if cell.axes.get("versions", INSTALLED) == INSTALLED:
        return {cell.id, own}
    return {cell.id, own, cell_id(matrix, {**cell.axes, "versions": INSTALLED})}


def rerun_command(name, cell_id, axes, tier="real", versions=None) -> str:
    """The cell again, on any machine with the plugin and its matrix file: ``pytest --simplefsdp-matrix NAME::ID``
    (``name``: the matrix as its items are named; a shipped profile's resolves from any folder), with the version
    set it ran on (or ``versions``, another set's label) and its tier. No path of this machine is in it (the ranks'
    own command is: command.txt)."""
    ran = axes.get("versions", INSTALLED)
    own = cell_id if ran == INSTALLED else cell_id.replace(f"-{parse(ran).slug()}", "", 1)
    vset = versions or ran
    args = ["pytest", "--simplefsdp-matrix", f"{str(name).removesuffix('[trace]')}::{own}"]
    if vset != INSTALLED:
        args.append(f"--simplefsdp-versions={vset}")
        if "torchtitan@" in vset:
            args.append("--simplefsdp-torchtitan-repo=<your torchtitan clone>")
    if str(tier) == "trace":
        args.append("--simplefsdp-tier=trace")
    return " ".join(a if a.startswith("--simplefsdp-torchtitan-repo=") else shlex.quote(a) for a in args)


def cell_key(profile, tier, cell_id) -> str:
    """A cell's key across runs and machines: profile (and tier) and cell id, never the matrix file's path, which
    depends on the rootdir a run started from (CI and a laptop name the same file differently)."""
    return f"{profile}{'[trace]' if str(tier) == 'trace' else ''}::{cell_id}"


def world_size(matrix: Matrix, axes: dict) -> int:
    if matrix.upstream:
        return matrix.upstream[axes["upstream"]].ngpu
    if not matrix.degrees:
        return matrix.world_sizes[0]
    return math.prod(axes[d] for d in matrix.degrees)


def rule_names(matrix: Matrix, axes: dict) -> dict:
    """What a rule's drop_if and reason can refer to."""
    names = {
        "world": world_size(matrix, axes),
        "world_sizes": matrix.world_sizes,
        "profile": matrix.profile,
        "device": matrix.device,
    }
    facts = matrix.models.get(axes.get("model"), {}) if "model" in axes else {}
    names.update(facts)
    names.update(axes)
    return names


def _drop_reason(matrix: Matrix, axes: dict):
    names = rule_names(matrix, axes)
    for rule in matrix.rules:
        try:
            dropped = eval(rule.code, {"__builtins__": {}, **RULE_FUNCTIONS}, names)  # checked by compile_rule
        except NameError as e:
            raise MatrixError(
                f"{rule.where}: rule {rule.name!r} uses an unknown name: {e}; known: {', '.join(sorted(names))}"
            ) from None
        except Exception as e:  # noqa: BLE001 - any error in user expressions is a matrix error
            raise MatrixError(f"{rule.where}: rule {rule.name!r} failed on {axes}: {type(e).__name__}: {e}") from None
        if dropped:
            try:
                reason = rule.reason.format(**names)
            except (KeyError, IndexError, ValueError) as e:
                raise MatrixError(f"{rule.where}: rule {rule.name!r}: reason refers to unknown name {e}") from None
            return rule.name, reason
    world = names["world"]
    if matrix.degrees and world not in matrix.world_sizes:  # a layout no rule caught must not reach a launcher
        product = " x ".join(f"{d} {axes[d]}" for d in matrix.degrees)
        return "world_sizes", f"{world} ranks ({product}) is not one of world_sizes {matrix.world_sizes}"
    return None


def excluder(entries):
    """A test of whether axes match any of the partial cells: one set lookup per distinct set of axes the entries
    name, instead of one comparison per entry (a profile's cross product times its excludes ran to millions)."""
    by_axes = {}
    for e in entries:
        names = tuple(sorted(e.values))
        by_axes.setdefault(names, set()).add(tuple(_key(e.values[n]) for n in names))
    groups = list(by_axes.items())

    def excluded(axes):
        return any(tuple(_key(axes.get(n)) for n in names) in values for names, values in groups)

    return excluded


def _key(value):
    """A value as a set member that compares as ``==`` does (1 == 1.0); an unhashable one (a list) by its repr."""
    try:
        hash(value)
        return value
    except TypeError:
        return ("unhashable", repr(value))


def expand(matrix: Matrix):
    """Return (cells, dropped) for a matrix, in a stable order."""
    if matrix.source and not matrix.upstream:
        raise MatrixError(
            f"{matrix.where('source')}: source upstream: its tests were not read (spec.upstream.with_source)"
        )
    names = list(matrix.axes)
    candidates = []  # (axes, where)
    excluded = excluder(matrix.exclude)
    for combo in itertools.product(*(matrix.axes[n] for n in names)):
        axes = dict(zip(names, combo))
        if matrix.upstream:  # an upstream test: rules, known failures and evidence see what it configures
            axes = upstream_axes(matrix.upstream[axes["upstream"]])
        if excluded(axes):
            continue
        candidates.append((axes, matrix.where("axes")))
    index = {tuple(a.items()): i for i, (a, _) in enumerate(candidates)}
    for entry in matrix.include:  # an included cell was asked for by name: a rule dropping it is an error
        # an axis it leaves out takes the axis's first value; the version sets are not a choice of the cell's but
        # of the run (--simplefsdp-versions, --simplefsdp-twin): it runs on each of them, as every other cell does
        sets = matrix.axes.get("versions", [None]) if "versions" not in entry.values else [entry.values["versions"]]
        for vset in sets:
            axes = {n: vset if n == "versions" else entry.values.get(n, matrix.axes[n][0]) for n in names}
            key = tuple(axes.items())
            if key in index:
                candidates[index[key]] = (axes, entry.where)
            else:
                index[key] = len(candidates)
                candidates.append((axes, entry.where))

    # a tier's own rules may drop an included cell (the trace tier cannot run everything the profile asks for)
    trace = matrix.trace if matrix.tier != "real" and matrix.trace else None
    tier_rules = {r.name for r in trace["rules"] + trace["gpu"]["rules"]} if trace else set()
    cells, dropped, by_id = [], [], {}
    for axes, where in candidates:
        cid = cell_id(matrix, axes)
        drop = _drop_reason(matrix, axes)
        if drop:
            if where != matrix.where("axes") and drop[0] not in tier_rules:
                raise MatrixError(f"{where}: include entry {cid} cannot run: rule {drop[0]!r}: {drop[1]}")
            dropped.append(Dropped(cid, axes, world_size(matrix, axes), *drop))
            continue
        if cid in by_id:
            raise MatrixError(
                f"{where}: two cells get the id {cid!r} ({by_id[cid].axes} and {axes}); "
                f"adjust `ids` so that every axis value shows"
            )
        smoke = any(e.matches(axes) for e in matrix.smoke)
        cell = Cell(cid, axes, world_size(matrix, axes), smoke, where)
        by_id[cid] = cell
        cells.append(cell)
    for entry in matrix.smoke:
        if not any(entry.matches(c.axes) for c in cells):
            raise MatrixError(f"{entry.where}: smoke entry {entry.values} matches no valid cell")
    return cells, dropped
