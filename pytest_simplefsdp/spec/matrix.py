"""Step 1 of the pipeline: read and validate a matrix file (axes, include/exclude, rules).

A matrix file is YAML in the shape of a GitHub Actions matrix plus rules that drop impossible
cells with a reason. Every error names the file, the line and the offending value.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..kinds import Device, Tier
from ..versions.sets import INSTALLED, VersionError, parse
from ..words import did_you_mean
from ..yamlio import MatrixError, line_of, load_yaml, plain

TOP_KEYS = {
    "profile": "name of the profile this file defines (cpu, h100x8, ...)",
    "description": "free text shown in --help listings",
    "target": "what each cell runs: a built-in target name, or {command: [...]} template",
    "device": "cpu (gloo ranks) or cuda (nccl ranks, one GPU per rank)",
    "world_sizes": "rank counts a cell may use; the product of `degrees` must be one of them",
    "degrees": "axes whose product is a cell's world size",
    "settings": "target settings shared by every cell (steps, seq_len, ...)",
    "models": "per-model facts the rules can use (e.g. moe: true)",
    "axes": "axis name -> list of values; the matrix is their cross product",
    "exclude": "partial cells to remove from the cross product",
    "include": "extra cells (axes left out take the axis's first value)",
    "rules": "list of {name, drop_if, reason}: drop cells that cannot run, with a reason",
    "smoke": "partial cells that form the small `smoke` tier (pytest -m smoke)",
    "ids": "axis -> {prefix, omit}: how a value is written in a cell id",
    "timeout": "default per-cell timeout in seconds for this profile",
    "groups": "name -> partial cells: a keyword every matching cell gets (pytest -k NAME)",
    "source": "upstream: one cell per SimpleFSDP integration test of the installed torchtitan, with its flags, "
    "rank count and name (no `axes`; rules see the axes each test configures, plus runs, disabled, kind)",
    "features": 'name -> torchtitan flags ("--compile.passes auto_bucketing") that a cell whose `feature` axis '
    "takes that name adds: what upstream tests set beyond the axes (passes, async TP, EP overlap, ...); "
    "or {flags: [...], then: [[...], ...]}: each `then` entry is one more run of the cell in the same "
    "dump folder (resuming its checkpoint), with those flags on top; `before: precompile` runs the "
    "target's step of that name first (one process) and the cell with what it made",
    "numerics": "compare losses, gradient, update and parameter norms with a baseline: {global_batch_size, baseline, "
    "lanes: [{name, match, rtol, atol, max_miss, grad_rtol, grad_atol, grad_steps, update_rtol, "
    "update_atol, update_steps}], noise: FILE or [FILE, ...] (each layout's measured noise, one file per version set: "
    "its tolerance where its versions and machine ran, see "
    "docs/design.md)}",
    "trace": "the trace tier (--simplefsdp-tier trace): {models, settings, rules, rank} that replace the "
    "profile's when each cell runs as one simulated rank on a CPU machine; gpu: {settings, rules} instead where "
    "a GPU profile's simulated rank runs on a visible GPU (the profile's own models, inductor for real)",
    "versions": "package -> versions every cell runs on ({torch: [installed, 2.15.0]}): an axis `versions` whose "
    "values are version sets (torch==2.15.0); each set runs in an environment of its own (uv)",
}
TRACE_KEYS = {"models", "settings", "rules", "rank", "gpu"}
TRACE_GPU_KEYS = {"settings", "rules"}
NUMERICS_KEYS = {"global_batch_size", "baseline", "lanes", "noise"}
NOISE_KINDS = ("loss", "grad_norm", "update_norm")  # what a noise file measures per layout
LANE_KEYS = {
    "name",
    "match",
    "compare",
    "rtol",
    "atol",
    "max_miss",
    "grad_rtol",
    "grad_atol",
    "grad_steps",
    "update_rtol",
    "update_atol",
    "update_steps",
}
RULE_KEYS = {"name", "drop_if", "reason"}
ID_KEYS = {"prefix", "omit"}
DEVICES = tuple(d.value for d in Device)


class SourceUnavailable(MatrixError):
    """A well-formed `source: upstream` matrix whose torchtitan (and its tests) is not installed here."""


@dataclass
class Rule:
    name: str
    drop_if: str
    reason: str
    where: str  # "file:line"
    code: object = None


def matches(partial: dict, axes: dict) -> bool:
    """Whether a cell's axes take every value a partial cell names (the one definition of a match)."""
    return all(axes.get(k) == v for k, v in partial.items())


@dataclass
class Entry:
    """A partial cell from include/exclude/smoke/groups, with where it was written."""

    values: dict
    where: str

    def matches(self, axes: dict) -> bool:
        return matches(self.values, axes)


@dataclass
class Lane:
    """How closely a group of cells must follow its baseline's losses."""

    name: str
    match: list  # partial cells
    rtol: float = 0.0
    atol: float = 0.0
    max_miss: float = 0.0  # share of steps allowed outside the tolerance
    where: str = ""
    grad_rtol: float | None = None  # per-parameter gradient and parameter norms (default: rtol, atol)
    grad_atol: float | None = None
    grad_steps: int = 1  # steps whose per-parameter norms are compared (the weights are compared at step 0)
    update_rtol: float | None = None  # per-parameter update norms of the optimizer step (default: grad_rtol, grad_atol)
    update_atol: float | None = None
    update_steps: int | None = None  # steps whose update norms are compared (default: every step)
    compare: bool = True  # false: the cells it takes are not compared (a baseline of theirs would run another config)


@dataclass
class Noise:
    """Each layout's own noise: the largest relative difference from its baseline a clean run of the whole profile
    showed (loss, step-1 gradient norms, update norms), measured on ``measured_on``'s versions. A cell's tolerance
    is ``margin`` times its layout's noise (at least ``floor``), never more than its lane's."""

    path: Path
    margin: float
    floor: float
    measured_on: dict  # package -> version the noise was measured on
    layouts: dict  # cell id -> {kind: largest relative difference}


@dataclass
class Numerics:
    global_batch_size: int
    baseline: dict  # axis values the baseline cell takes (its dp degree is the cell's)
    lanes: list
    noise: Noise | None = None  # the first noise file the section names
    noises: tuple = ()  # all of them, one per version set measured (0.2.0's and 0.2.2's): each holds where it ran


@dataclass
class Matrix:
    path: Path
    profile: str
    target: object
    device: Device
    world_sizes: list
    degrees: list
    axes: dict  # name -> list of values, in file order
    settings: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    exclude: list = field(default_factory=list)
    include: list = field(default_factory=list)
    rules: list = field(default_factory=list)
    smoke: list = field(default_factory=list)
    ids: dict = field(default_factory=dict)
    timeout: float | None = None
    description: str = ""
    groups: dict = field(default_factory=dict)  # name -> [Entry]
    features: dict = field(default_factory=dict)  # name -> [flag words] a cell with axis feature=<name> adds
    feature_runs: dict = field(default_factory=dict)  # name -> [[flag words] of each run after the first]
    feature_before: dict = field(default_factory=dict)  # name -> [steps the target runs before the cell] (precompile)
    source: str | None = None  # "upstream": the cells are the installed torchtitan's own tests (spec.upstream)
    upstream: dict = field(default_factory=dict)  # ... test name -> upstream.UpstreamTest, once read
    numerics: Numerics | None = None
    trace: dict | None = None  # the trace tier's overrides (see with_tier)
    tier: Tier = Tier.REAL
    lines: dict = field(default_factory=dict)  # top key -> "file:line"

    def where(self, key):
        return self.lines.get(key, str(self.path))


def _check_keys(path, node, allowed, what):
    for key in node:
        if key not in allowed:
            raise MatrixError(
                f"{line_of(path, node, key=key)}: unknown {what} key {key!r}; "
                f"allowed: {', '.join(sorted(allowed))}{did_you_mean(key, allowed)}"
            )


def _mapping_or_none(path, doc, key, where, prefix=""):
    node = doc.get(key)
    if node is not None and not isinstance(node, dict):
        kind = "a list" if isinstance(node, list) else f"{plain(node)!r}"
        raise MatrixError(f"{where}: `{prefix}{key}` must be a mapping (name: value), got {kind}")


def _entries(path, doc, key, axes, known_values=False):
    """Partial cells under ``doc[key]``; ``known_values``: each value must be one its axis lists (an
    exclude of a value no axis has removes nothing, and is a typo)."""
    node = doc.get(key) or []
    if not isinstance(node, list):
        raise MatrixError(f"{line_of(path, doc, key=key)}: `{key}` must be a list of partial cells")
    out = []
    for i, item in enumerate(node):
        where = line_of(path, node, index=i)
        if not isinstance(item, dict) or not item:
            raise MatrixError(f"{where}: `{key}` entry must be a mapping of axis: value, got {item!r}")
        for axis in item:
            if axis not in axes:
                raise MatrixError(
                    f"{line_of(path, item, key=axis)}: `{key}` names unknown axis {axis!r}; "
                    f"axes: {', '.join(axes)}{did_you_mean(axis, axes)}"
                )
            if known_values and plain(item[axis]) not in axes[axis]:
                raise MatrixError(
                    f"{line_of(path, item, key=axis)}: `{key}` entry {axis}: {plain(item[axis])!r} is "
                    f"not a value of axis {axis!r}; its values: {', '.join(map(str, axes[axis]))}"
                    + did_you_mean(plain(item[axis]), axes[axis])
                )
        out.append(Entry(plain(item), where))
    return out


def load_matrix(path) -> Matrix:
    """Load and validate a matrix file; every problem is a MatrixError naming the file, line and value."""
    path = Path(path)
    doc = load_yaml(path)
    if not isinstance(doc, dict):
        raise MatrixError(f"{path}:1: a matrix file must be a YAML mapping, got {type(doc).__name__}")
    _check_keys(path, doc, TOP_KEYS, "top-level")
    lines = {k: line_of(path, doc, key=k) for k in doc}
    source = _source(path, doc, lines)
    for key in ("profile", "target") + (() if source else ("axes",)):
        if key not in doc:
            raise MatrixError(f"{path}: missing required key `{key}`")
    axes = {"upstream": []} if source else _axes(path, doc, lines)
    if "versions" in doc:
        axes["versions"] = _versions(doc["versions"], lines["versions"])
    for key in ("settings", "models", "ids", "groups"):  # (a list here once crashed or passed silently)
        _mapping_or_none(path, doc, key, lines.get(key))
    return Matrix(
        path=path,
        source=source,
        groups=_groups(path, doc, axes),
        **_features(path, doc, axes, lines),
        numerics=_numerics(path, doc, axes),
        trace=_trace(path, doc, lines),
        profile=str(doc["profile"]),
        target=plain(doc["target"]),
        device=_device(doc, lines, path),
        world_sizes=_world_sizes(doc, lines, path),
        degrees=_degrees(path, doc, lines, axes),
        axes=axes,
        settings=plain(doc.get("settings") or {}),
        models=plain(doc.get("models") or {}),
        exclude=_entries(path, doc, "exclude", axes, known_values=True),
        include=_entries(path, doc, "include", axes),
        rules=_rules(path, doc),
        smoke=_entries(path, doc, "smoke", axes),
        ids=_ids(path, doc, axes),
        timeout=_timeout(doc, lines),
        description=str(doc.get("description", "")),
        lines=lines,
    )


def _source(path, doc, lines):
    """``source: upstream``: the cells are the installed torchtitan's own integration tests, one each; they are
    read when the matrix runs (spec.upstream.with_source), not while its file is validated."""
    if "source" not in doc:
        return None
    if doc["source"] != "upstream":
        raise MatrixError(f"{lines['source']}: source {doc['source']!r}: the only source is upstream")
    if "axes" in doc:
        raise MatrixError(
            f"{lines['axes']}: a matrix with `source: upstream` takes its cells from upstream; it has no `axes`"
        )
    if doc.get("target") not in ("titan03", "titan02"):
        raise MatrixError(
            f"{lines['source']}: source upstream needs target titan03 or titan02, got {doc.get('target')!r}"
        )
    return "upstream"


def _axes(path, doc, lines):
    node = doc["axes"]
    if not isinstance(node, dict) or not node:
        raise MatrixError(f"{lines['axes']}: `axes` must map axis names to lists of values")
    axes = {}
    for name, values in node.items():
        where = line_of(path, node, key=name)
        if not isinstance(values, list) or not values:
            raise MatrixError(f"{where}: axis {name!r} must be a non-empty list, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise MatrixError(f"{where}: axis {name!r} lists a value twice: {list(values)}")
        axes[name] = plain(values)
    return axes


def _versions(node, where):
    """The matrix's `versions` key as the labels of the `versions` axis: one version set per combination."""
    if not isinstance(node, dict) or not node:
        raise MatrixError(
            f"{where}: `versions` must map packages to lists of versions, e.g. {{torch: [installed, 2.15.0]}}"
        )
    combos = [[]]
    for package, values in node.items():
        values = values if isinstance(values, list) else [values]
        combos = [c + [(package, v)] for c in combos for v in plain(values)]
    labels = []
    for combo in combos:
        text = ",".join(f"{p}=={v}" for p, v in combo if str(v) != INSTALLED) or INSTALLED
        try:
            labels.append(parse(text).label())
        except VersionError as e:
            raise MatrixError(f"{where}: versions: {e}") from None
    return list(dict.fromkeys(labels))


def with_versions(matrix: Matrix, labels) -> Matrix:
    """The matrix with its `versions` axis set to these version sets (--simplefsdp-versions, --simplefsdp-twin)."""
    if not labels:
        return matrix
    return replace(matrix, axes={**{a: v for a, v in matrix.axes.items() if a != "versions"}, "versions": list(labels)})


def _device(doc, lines, path):
    device = doc.get("device", "cpu")
    if device not in DEVICES:
        raise MatrixError(f"{lines.get('device', path)}: device {device!r} is not one of {DEVICES}")
    return Device(device)


def _world_sizes(doc, lines, path):
    world_sizes = plain(doc.get("world_sizes", []))
    if not world_sizes or not all(isinstance(w, int) and w > 0 for w in world_sizes):
        raise MatrixError(f"{lines.get('world_sizes', path)}: `world_sizes` must be a list of positive integers")
    return world_sizes


def _degrees(path, doc, lines, axes):
    degrees = plain(doc.get("degrees", []))
    for d in degrees:
        if d not in axes:
            raise MatrixError(f"{lines['degrees']}: degree {d!r} is not an axis; axes: {', '.join(axes)}")
        bad = [v for v in axes[d] if not isinstance(v, int) or v < 1]
        if bad:
            raise MatrixError(
                f"{line_of(path, doc['axes'], key=d)}: degree axis {d!r} has non-positive-integer values {bad}"
            )
    return degrees


def _trace(path, doc, lines):
    if doc.get("trace") is None:
        return None
    node = doc["trace"]
    if not isinstance(node, dict):
        raise MatrixError(f"{lines['trace']}: `trace` must be a mapping with keys {sorted(TRACE_KEYS)}")
    _check_keys(path, node, TRACE_KEYS, "trace")
    for key in ("models", "settings"):
        _mapping_or_none(path, node, key, line_of(path, node, key=key) if key in node else None, "trace.")
    gpu = node.get("gpu") or {}
    if not isinstance(gpu, dict):
        raise MatrixError(
            f"{line_of(path, node, key='gpu')}: `trace.gpu` must be a mapping with keys {sorted(TRACE_GPU_KEYS)}"
        )
    _check_keys(path, gpu, TRACE_GPU_KEYS, "trace.gpu")
    if "settings" in gpu:
        _mapping_or_none(path, gpu, "settings", line_of(path, gpu, key="settings"), "trace.gpu.")
    return {
        "models": plain(node.get("models") or {}),
        "settings": plain(node.get("settings") or {}),
        "rules": _rules(path, node),
        "rank": int(node.get("rank", 0)),
        "gpu": {"settings": plain(gpu.get("settings") or {}), "rules": _rules(path, gpu) if gpu else []},
    }


def _ids(path, doc, axes):
    ids = plain(doc.get("ids") or {})
    for axis, spec in ids.items():
        where = line_of(path, doc["ids"], key=axis)
        if axis not in axes:
            raise MatrixError(f"{where}: `ids` names unknown axis {axis!r}")
        if not isinstance(spec, dict):
            raise MatrixError(f"{where}: ids.{axis} must be a mapping with keys {sorted(ID_KEYS)}")
        _check_keys(path, doc["ids"][axis], ID_KEYS, f"ids.{axis}")
    return ids


def _timeout(doc, lines):
    timeout = doc.get("timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0):
        raise MatrixError(f"{lines['timeout']}: timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


def _features(path, doc, axes, lines):
    node = doc.get("features") or {}
    if not isinstance(node, dict):
        raise MatrixError(f"{lines['features']}: `features` must map names to lists of flags")
    features, runs, before = {}, {}, {}

    def flag_list(value, where, what):
        if not isinstance(value, list) or not all(isinstance(f, str) and f.startswith("--") for f in value):
            raise MatrixError(
                f'{where}: {what} must be a list of flags ("--section.option value"), got {plain(value)!r}'
            )
        return plain(value)

    for name, spec in node.items():
        where = line_of(path, node, key=name)
        if isinstance(spec, dict):
            _check_keys(path, spec, {"flags": "", "then": "", "before": ""}, f"features.{name}")
            if "then" in spec or "before" not in spec:
                then = spec.get("then") or []
                if not isinstance(then, list) or not then:
                    raise MatrixError(f"{where}: features.{name}.then must list the later runs' flags")
                runs[str(name)] = [flag_list(t, where, f"feature {name!r}: each `then` run") for t in then]
            if "before" in spec:  # steps the target knows how to run first (checked by the target: its STEPS)
                steps = plain(spec["before"])
                steps = [steps] if isinstance(steps, str) else steps
                if not isinstance(steps, list) or not steps or not all(isinstance(x, str) for x in steps):
                    raise MatrixError(
                        f"{where}: features.{name}.before must name the steps run before the cell "
                        f"(e.g. precompile), got {plain(spec['before'])!r}"
                    )
                before[str(name)] = steps
            spec = spec.get("flags") or []
        features[str(name)] = flag_list(spec, where, f"feature {name!r}")
    unknown = [v for v in axes.get("feature", []) if v != "none" and v not in features]
    if unknown:
        raise MatrixError(
            f"{line_of(path, doc['axes'], key='feature')}: axis 'feature' names {unknown}, which "
            f"`features` does not define (defined: {', '.join(features) or 'none'})"
        )
    return {"features": features, "feature_runs": runs, "feature_before": before}


def _groups(path, doc, axes):
    groups = {}
    for name in doc.get("groups") or {}:
        if not re.fullmatch(r"[A-Za-z_]\w*", str(name)):
            raise MatrixError(f"{line_of(path, doc['groups'], key=name)}: group name {name!r} must be a word (-k NAME)")
        groups[str(name)] = _entries(path, doc["groups"], name, axes)
    return groups


def _mappings(path, parent, key, allowed, what):
    """The mappings listed under ``parent[key]``, each checked for unknown keys, with its line."""
    for i, item in enumerate(parent.get(key) or []):
        where = line_of(path, parent[key], index=i)
        if not isinstance(item, dict):
            raise MatrixError(f"{where}: a {what} must be a mapping with keys {sorted(allowed)}")
        _check_keys(path, item, allowed, what)
        yield where, item


# what a rule may say: names, constants, comparisons (in / not in too), and/or/not, arithmetic, a literal
# tuple/list/set, a conditional, and calls of these functions. No attributes, subscripts, lambdas or
# comprehensions: `().__class__.__base__.__subclasses__()` once reached os.system from a matrix file.
RULE_FUNCTIONS = {"len": len, "min": min, "max": max}
_RULE_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Set,
    ast.IfExp,
    ast.Call,
)


def compile_rule(expr: str, name: str):
    """Code for a drop_if expression, or a ValueError saying which construct a rule may not use."""
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _RULE_NODES):
            raise ValueError(f"{type(node).__name__} ({ast.get_source_segment(expr, node) or '?'}) is not allowed")
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            raise ValueError(f"name {node.id!r} is not allowed")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in RULE_FUNCTIONS and not node.keywords
        ):
            raise ValueError(
                f"call {ast.get_source_segment(expr, node)!r}: only {', '.join(RULE_FUNCTIONS)} may be called"
            )
    return compile(tree, f"<rule {name}>", "eval")


def _rules(path, doc):
    """The `rules` list of a mapping (the matrix or its `trace` section)."""
    rules = []
    for where, item in _mappings(path, doc, "rules", RULE_KEYS, "rule"):
        missing = RULE_KEYS - set(item)
        if missing:
            raise MatrixError(f"{where}: rule {item.get('name', '?')!r} is missing {sorted(missing)}")
        where = line_of(path, item, key="drop_if")  # errors are about the expression
        rule = Rule(str(item["name"]), str(item["drop_if"]), str(item["reason"]), where)
        try:
            rule.code = compile_rule(rule.drop_if, rule.name)
        except SyntaxError as e:
            raise MatrixError(
                f"{where}: rule {rule.name!r}: drop_if is not a valid expression: {rule.drop_if!r} ({e.msg})"
            ) from None
        except ValueError as e:
            raise MatrixError(
                f"{where}: rule {rule.name!r}: drop_if {rule.drop_if!r}: {e}; a rule may use names, "
                f"comparisons, in, and/or/not, arithmetic and {', '.join(RULE_FUNCTIONS)}"
            ) from None
        rules.append(rule)
    names = [r.name for r in rules]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise MatrixError(f"{line_of(path, doc, key='rules')}: duplicate rule names {sorted(dupes)}")
    return rules


def _numerics(path, doc, axes):
    node = doc.get("numerics")
    if node is None:
        return None
    where = line_of(path, doc, key="numerics")
    if not isinstance(node, dict):
        raise MatrixError(f"{where}: `numerics` must be a mapping with keys {sorted(NUMERICS_KEYS)}")
    _check_keys(path, node, NUMERICS_KEYS, "numerics")
    gbs = node.get("global_batch_size")
    if not isinstance(gbs, int) or gbs < 1:
        raise MatrixError(
            f"{line_of(path, node, key='global_batch_size') if 'global_batch_size' in node else where}: "
            f"numerics.global_batch_size must be a positive integer, got {gbs!r}"
        )
    baseline = plain(node.get("baseline") or {})
    for axis in baseline:
        if axis not in axes:
            raise MatrixError(
                f"{line_of(path, node['baseline'], key=axis)}: numerics.baseline names unknown axis {axis!r}"
            )
    lanes = []
    for lwhere, item in _mappings(path, node, "lanes", LANE_KEYS, "lane"):
        name = item.get("name")
        if not name:
            raise MatrixError(f"{lwhere}: a lane needs a `name`")
        numbers = {}
        for key in ("rtol", "atol", "max_miss", "grad_rtol", "grad_atol", "update_rtol", "update_atol"):
            if key.startswith(("grad_", "update_")) and key not in item:
                continue
            value = item.get(key, 0.0)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value < 0
                or (key == "max_miss" and value > 1)
            ):
                raise MatrixError(
                    f"{line_of(path, item, key=key)}: lane {name!r}: {key} must be a number >= 0"
                    f"{' and <= 1' if key == 'max_miss' else ''}, got {value!r}"
                )
            numbers[key] = float(value)
        for key, default in (("grad_steps", 1), ("update_steps", None)):
            steps = item.get(key, default)
            if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
                raise MatrixError(
                    f"{line_of(path, item, key=key)}: lane {name!r}: {key} must be an integer >= 0, got {steps!r}"
                )
            numbers[key] = steps
        compare = item.get("compare", True)
        if not isinstance(compare, bool):
            raise MatrixError(f"{line_of(path, item, key='compare')}: lane {name!r}: compare must be true or false")
        numbers["compare"] = compare
        match = _entries(path, item, "match", axes) if "match" in item else []  # no `match`: every cell
        lanes.append(Lane(str(name), [e.values for e in match] or [{}], where=lwhere, **numbers))
    if not lanes:
        raise MatrixError(f"{where}: numerics needs at least one lane")
    named = node.get("noise")
    files = [] if named is None else named if isinstance(named, list) else [named]
    noises = tuple(_noise(path, node, file) for file in files)
    return Numerics(gbs, baseline, lanes, noises[0] if noises else None, noises)


def _noise(path, node, name):
    """A noise file the numerics section names (relative to the matrix file)."""
    where = line_of(path, node, key="noise")
    file = Path(path).parent / str(name)
    if not file.is_file():
        raise MatrixError(
            f"{where}: numerics.noise: no file {file} (a copy of a shipped profile needs its "
            f"noise/ folder beside it; without the key each lane judges alone)"
        )
    doc = load_yaml(file)
    if not isinstance(doc, dict) or not isinstance(doc.get("layouts"), dict):
        raise MatrixError(
            f"{file}: a noise file is a mapping with `measured_on`, `margin`, `floor` and `layouts` "
            f"(cell id -> {{{', '.join(NOISE_KINDS)}}})"
        )
    _check_keys(file, doc, {"measured_on", "margin", "floor", "layouts"}, "noise")
    numbers = {}
    for key in ("margin", "floor"):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise MatrixError(
                f"{line_of(file, doc, key=key) if key in doc else file}: {key} must be a number > 0, got {value!r}"
            )
        numbers[key] = float(value)
    layouts = {}
    for cell, row in doc["layouts"].items():
        if not isinstance(row, dict) or any(
            k not in NOISE_KINDS or isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
            for k, v in row.items()
        ):
            raise MatrixError(
                f"{line_of(file, doc['layouts'], key=cell)}: layout {cell!r}: a mapping of "
                f"{', '.join(NOISE_KINDS)} to numbers >= 0, got {plain(row)!r}"
            )
        layouts[str(cell)] = {k: float(v) for k, v in row.items()}
    return Noise(file, numbers["margin"], numbers["floor"], plain(doc.get("measured_on") or {}), layouts)


def with_tier(matrix: Matrix, tier: Tier | str, gpus: int = 0) -> Matrix:
    """The matrix as a tier runs it. ``trace``: every cell is one simulated rank (torchtitan's fake backend): on this
    CPU machine with the file's `trace` models, settings and rules; or, for a GPU profile where ``gpus`` GPUs are
    visible, on one GPU with the profile's own models and `trace.gpu`'s settings and rules (its inductor cells
    compile and run for real there)."""
    if tier == "real":
        return matrix
    if not matrix.trace:
        raise MatrixError(f"{matrix.path}: tier {tier!r} needs a `trace` section in the matrix file")
    if gpus > 0 and matrix.device == Device.CUDA:
        gpu = matrix.trace["gpu"]
        return replace(
            matrix,
            tier=Tier.of(tier),
            numerics=None,
            settings={**matrix.settings, **gpu["settings"]},
            rules=matrix.rules + gpu["rules"],
        )
    models = {m: {**matrix.models.get(m, {}), **facts} for m, facts in matrix.models.items()}
    for m, facts in matrix.trace["models"].items():
        models[m] = {**models.get(m, {}), **facts}
    return replace(
        matrix,
        tier=Tier.of(tier),
        device=Device.CPU,
        models=models,
        numerics=None,
        settings={**matrix.settings, **matrix.trace["settings"]},
        rules=matrix.rules + matrix.trace["rules"],
    )
