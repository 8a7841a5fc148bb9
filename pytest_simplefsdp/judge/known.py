"""Step 5, its input: the known failures (``known_failures.yaml``), loaded and validated, and which entries apply
to a cell.

An entry says *when* (conditions on cell axes and on the environment) a cell is known to fail,
with which *error* (a regex searched in the cell's normalised error signature), how to treat it
(*kind*: xfail, flaky, skip), why (*reason*) and where it is tracked (*link*, required).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import re2
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..kinds import FailureClass, KnownKind
from ..versions.git import GitError, commit_clauses
from ..words import did_you_mean, release
from ..yamlio import MatrixError, line_of, load_yaml, plain

ENTRY_KEYS = {
    "id": "stable name of the entry (letters, digits, - _ .)",
    "when": "conditions: axis: value | [values] | '>1' (also profile, target, device, tier, torch, torchtitan "
    "release ranges, torchtitan_commit ranges: '>=5dd944e62', '<1a2b3c4d', '>=A,<B')",
    "error": "regex searched in the normalised error signature (and the raw error text)",
    "kind": "xfail (run, expect this failure) | flaky (pass, or this failure and a rerun that passes) | skip (do "
    "not run)",
    "link": "upstream issue, PR or review comment (required)",
    "reason": "one line: what fails and why (required for skip)",
    "classes": "optional list of failure classes the entry accepts (compile, runtime, ...)",
    "first_failing": "optional package -> the first version it fails on ({torch: 2.14.0}; a bisection writes it)",
    "last_passing": "optional package -> the last version it passes on (the other end of that window)",
    "fixed_in": "optional package -> the version that fixed it",
    "pass_rate": "kind flaky (required there): the share of runs that pass (0.5); a matching failure is rerun "
    "until a pass is 99 % likely by it, and is new where every run fails",
}
WINDOW_KEYS = ("first_failing", "last_passing", "fixed_in")
ENV_KEYS = {"profile", "target", "device", "tier"}
VERSION_KEYS = {"torch", "torchtitan"}
# a range of torchtitan commits, decided by ancestry in the checkout the cell's torchtitan runs from: what scopes an
# entry where torchtitan is installed from a commit (main says 0.2.2 at every commit: a release range says nothing)
COMMIT_KEY = "torchtitan_commit"
COMPARISON = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+)\s*$")
_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def signature(error_text: str | None) -> str:
    """The parts of an error that identify it, with run- and layout-specific parts replaced.

    Symbol numbers (u0, s27), addresses, object ids, numbers that follow the batch shape
    (Eq(u0 + u1, 6144) == Eq(u0 + u1, 3072)) or a loss's size (10.7, 1e+12, nan), temp paths and rank prefixes
    become placeholders.
    """
    if not error_text:
        return ""
    text = re.sub(r"\[rank\d+\]:?", "", error_text)
    text = re.sub(r"\b0x[0-9a-fA-F]+\b", "0xADDR", text)
    text = re.sub(r"(?<![\w.])(/[\w.\-+]+)+/?", "<path>", text)
    # a number standing alone, whatever its size or spelling (12, -0.5, 1.2e-03, nan, inf), is one placeholder: a
    # loss of 10.7 and one of 1e+12 are the same failure
    text = re.sub(r"(?<![\w.])[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)(?![\w.])", "N", text)
    text = re.sub(r"0xADDR|\d+", lambda m: m.group(0) if m.group(0) == "0xADDR" else "N", text)  # (not NxADDR)
    text = re.sub(r"\s+", " ", text).strip()
    return text[:2000]


@dataclass
class Entry:
    id: str
    when: dict
    error: str
    kind: KnownKind
    link: str
    reason: str
    classes: list = field(default_factory=list)
    where: str = ""
    pattern: object = None
    foreign: bool = False  # its `profile` condition names only profiles not loaded here: its axes are not checked
    window: dict = field(default_factory=dict)  # first_failing / last_passing / fixed_in -> {package: version}
    pass_rate: float | None = None  # kind flaky: the share of runs that pass

    @property
    def todo(self) -> bool:
        """Its link is still the update command's placeholder (a warning, not an error)."""
        return self.link.upper().startswith("TODO")

    def label(self):
        return f"{self.id} ({self.link})"


def _condition_holds(value, cond):
    if isinstance(cond, list):
        return any(_condition_holds(value, c) for c in cond)
    if isinstance(cond, str) and isinstance(value, int) and not isinstance(value, bool):
        m = COMPARISON.match(cond)
        if m:
            return _OPS[m.group(1)](value, int(m.group(2)))
    return value == cond


def _version_holds(version, spec):
    if version is None:
        return False
    try:
        return Version(release(version)) in SpecifierSet(spec)
    except (InvalidVersion, InvalidSpecifier):
        return False


def applies(entry: Entry, axes: dict, env: dict) -> bool:
    """Whether the entry's conditions hold for a cell. ``env["torchtitan_commit"]``: the commit the cell's torchtitan
    runs (versions.git.Commit), None for a release: a release decides by ``torchtitan``, a commit by
    ``torchtitan_commit``, and an entry that scopes only the other way does not hold (scope_problem says why, at
    start)."""
    commit = env.get(COMMIT_KEY)
    for key, cond in entry.when.items():
        if key == "torchtitan" and commit is not None:
            if COMMIT_KEY in entry.when:
                continue  # installed from a commit: its commit range decides
            return False
        if key == COMMIT_KEY:
            if commit is None:
                if "torchtitan" in entry.when:
                    continue  # a release: its release range decides
                return False
            try:
                if not commit.holds(str(cond)):
                    return False
            except GitError:
                return False
        elif key in VERSION_KEYS:
            if not _version_holds(env.get(key), str(cond)):
                return False
        elif key in ENV_KEYS:
            if not _condition_holds(env.get(key), cond):
                return False
        elif key not in axes or not _condition_holds(axes[key], cond):
            return False
    return True


def scope_problem(entry: Entry, env: dict) -> str | None:
    """Why the entry's torchtitan scope cannot be decided for a cell of this environment, else None: a release range
    under a torchtitan installed from a commit (main's version string names no release), or a commit range the
    checkout cannot order."""
    commit = env.get(COMMIT_KEY)
    if commit is not None and "torchtitan" in entry.when and COMMIT_KEY not in entry.when:
        return (
            f"torchtitan: {entry.when['torchtitan']!r} is a release range, but torchtitan here runs commit "
            f"{commit.sha[:12]} (its version string, {env.get('torchtitan')}, names no release): scope it by "
            f"commit as well ({COMMIT_KEY}: '>=<first failing commit>')"
        )
    if commit is not None and COMMIT_KEY in entry.when:
        try:
            commit.holds(str(entry.when[COMMIT_KEY]))
        except GitError as e:
            return f"{COMMIT_KEY}: {entry.when[COMMIT_KEY]!r}: {e}"
    return None


def commit_scope(window: dict) -> str | None:
    """The ``torchtitan_commit`` range a bisection's window over torchtitan commits gives an entry: ``>=`` its first
    failing commit (a regression), ``<`` its fix; None for a window of releases."""
    first, fixed = (window.get(k, {}).get("torchtitan") for k in ("first_failing", "fixed_in"))
    commit = first or fixed
    if not commit or not re.fullmatch(r"[0-9a-f]{7,40}", str(commit)):
        return None
    return f">={commit}" if first else f"<{commit}"


class KnownFailures:
    def __init__(self, path, entries):
        self.path = Path(path)
        self.entries = entries

    def about(self):
        """What a run records of the file that judged it (the report tool judges with it again)."""
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest() if self.path.is_file() else ""
        return {"known_failures": {"path": str(self.path.resolve()), "sha256": digest}}

    def for_cell(self, axes, env):
        return [e for e in self.entries if applies(e, axes, env)]


TODO_LINK = "TODO: the upstream issue"  # what the update command writes for a new entry; loaded with a warning


def load_known_failures(path, axis_names: set, profiles=None) -> KnownFailures:
    """Load and validate; every problem is a MatrixError naming file, line and entry id. ``profiles``: the
    profiles known here; an entry whose `profile` condition names none of them is for another matrix (its
    conditions' axes are that matrix's): loaded, marked foreign, its axes unchecked."""
    path = Path(path)
    doc = load_yaml(path)
    if doc is None:
        return KnownFailures(path, [])
    if not isinstance(doc, list):
        raise MatrixError(f"{path}:1: known failures must be a YAML list of entries")
    entries: list = []
    ids: dict = {}
    for i, node in enumerate(doc):
        entry = _entry(path, node, line_of(path, doc, index=i), axis_names, profiles)
        if entry.id in ids:
            raise MatrixError(
                f"{line_of(path, node, key='id')}: duplicate entry id {entry.id!r} (first at {ids[entry.id]})"
            )
        ids[entry.id] = entry.where
        entries.append(entry)
    return KnownFailures(path, entries)


def _entry(path, node, where, axis_names, profiles=None) -> Entry:
    if not isinstance(node, dict):
        raise MatrixError(f"{where}: an entry must be a mapping with keys {', '.join(ENTRY_KEYS)}")
    eid = str(node.get("id", "?"))
    at = lambda key: f"{line_of(path, node, key=key)}: entry {eid!r}"  # noqa: E731 - where a key's problem is
    for key in node:
        if key not in ENTRY_KEYS:
            raise MatrixError(
                f"{at(key)}: unknown key {key!r}; allowed: {', '.join(ENTRY_KEYS)}" + did_you_mean(key, ENTRY_KEYS)
            )
    for key in ("id", "when", "error", "kind", "link", "reason"):
        if not node.get(key) and not (key == "error" and node.get("kind") == KnownKind.SKIP):
            raise MatrixError(
                f"{where}: entry {eid!r}: missing `{key}`"
                + (" (the upstream issue, PR or review comment)" if key == "link" else "")
            )
    if not re.fullmatch(r"[\w.\-]+", eid):
        raise MatrixError(f"{line_of(path, node, key='id')}: entry id {eid!r}: use letters, digits, - _ .")
    link = str(node["link"]).strip()
    if not link.upper().startswith("TODO") and not re.match(r"https?://", link):  # (TODO: a warning at start-up)
        raise MatrixError(f"{at('link')}: link {link!r} is not a URL; name the upstream issue, PR or review comment")
    try:
        kind = KnownKind.of(node["kind"])
    except ValueError:
        raise MatrixError(f"{at('kind')}: kind {node['kind']!r} is not one of {', '.join(KnownKind)}") from None
    if not isinstance(node["when"], dict):
        raise MatrixError(f"{at('when')}: `when` must map axes to values")
    named = node["when"].get("profile")
    named = set(plain(named) if isinstance(named, list) else [named]) if named else set()
    foreign = profiles is not None and bool(named) and not named & set(profiles)
    _check_when(path, node["when"], eid, None if foreign else axis_names)
    classes = plain(node.get("classes") or [])
    unknown = [c for c in (classes if isinstance(classes, list) else [classes]) if c not in set(FailureClass)]
    if unknown or not isinstance(classes, list):
        raise MatrixError(
            f"{at('classes')}: classes {classes!r}: not a list of failure classes "
            f"({', '.join(c.value for c in FailureClass)})"
        )
    pattern = _pattern(str(node["error"]), at("error")) if node.get("error") else None
    window = {key: _window(plain(node[key]), at(key), key) for key in WINDOW_KEYS if key in node}
    rate = node.get("pass_rate")
    if kind == KnownKind.FLAKY and rate is None:
        raise MatrixError(
            f"{at('kind')}: kind flaky needs `pass_rate` (the share of runs that pass, e.g. 0.5): a failure it "
            f"matches is rerun until a pass is likely by that rate"
        )
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1):
        raise MatrixError(
            f"{at('pass_rate')}: pass_rate {rate!r} must be a number between 0 and 1 (0: it never passes, an "
            f"xfail; 1: it never fails)"
        )
    return Entry(
        eid,
        plain(node["when"]),
        str(node.get("error") or ""),
        kind,
        link,
        str(node["reason"]),
        classes,
        where,
        pattern,
        foreign,
        window,
        None if rate is None else float(rate),
    )


def _window(value, where, key):
    """``{torch: 2.14.0}``: a package of a version set and a version (or a torchtitan commit)."""
    if not isinstance(value, dict) or not value:
        raise MatrixError(f"{where}: {key} must map packages to versions, e.g. {{torch: 2.14.0}}, got {value!r}")
    for package, version in value.items():
        if package not in VERSION_KEYS:
            raise MatrixError(f"{where}: {key}: {package!r} is not one of {', '.join(sorted(VERSION_KEYS))}")
        if not re.fullmatch(r"[0-9a-f]{7,40}", str(version)):
            try:
                Version(str(version))
            except InvalidVersion:
                raise MatrixError(f"{where}: {key}: {package} {version!r} is not a version or a commit") from None
    return {p: str(v) for p, v in value.items()}


def outside_window(entry: Entry, versions: dict | None) -> str | None:
    """Why the versions a cell ran on lie where the entry's window says the cell passes, or None (inside it, or
    no window, or versions it cannot order, such as commits)."""
    for package, ran in (versions or {}).items():
        try:
            ran = Version(release(ran))
        except InvalidVersion:
            continue

        def at(key, package=package):
            v = entry.window.get(key, {}).get(package)
            try:
                return Version(v) if v else None
            except InvalidVersion:
                return None

        first, last, fixed = at("first_failing"), at("last_passing"), at("fixed_in")
        if first is not None and ran < first:
            return f"{package} {ran} is before its first failing {package} {first}"
        if last is not None and ran <= last:
            return f"{package} {ran} is at or before its last passing {package} {last}"
        if fixed is not None and ran >= fixed:
            return f"{package} {ran} has its fix ({package} {fixed})"
    return None


def _check_when(path, when, eid, axis_names):
    for key, cond in when.items():
        kwhere = line_of(path, when, key=key)
        known = ENV_KEYS | VERSION_KEYS | {COMMIT_KEY}
        if axis_names is not None and key not in axis_names and key not in known:
            raise MatrixError(
                f"{kwhere}: entry {eid!r}: condition on unknown axis {key!r}; axes: "
                f"{', '.join(sorted(axis_names))}; environment: {', '.join(sorted(known))}"
                + did_you_mean(key, set(axis_names) | known)
            )
        if key == COMMIT_KEY:
            try:
                commit_clauses(str(cond))
            except ValueError as e:
                raise MatrixError(f"{kwhere}: entry {eid!r}: {key}: {e} (e.g. '>=5dd944e62', '>=A,<B')") from None
        if key in VERSION_KEYS:
            try:
                SpecifierSet(str(cond))
            except InvalidSpecifier:
                raise MatrixError(
                    f"{kwhere}: entry {eid!r}: {key}: {cond!r} is not a version range (e.g. '>=2.13,<2.15')"
                ) from None


def _pattern(error, where):
    try:
        return compile_signature(error)
    except re2.error as e:
        reason = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise MatrixError(f"{where}: error {error!r} is not a regex RE2 can match in linear time: {reason}") from None


def compile_signature(pattern: str):
    """A known-failure `error` pattern, matched by RE2: linear time, so no pattern can hang the judging
    (`(a+)+$` once spun for minutes on a 200-character error line). RE2 has no backreferences or lookaround."""
    options = re2.Options()
    options.log_errors = False  # the error comes back as the exception, with the file and line
    return re2.compile(pattern, options)


def could_apply(entry: Entry, axes: dict, env: dict) -> bool:
    """Whether an entry matches a cell in some environment (versions and tier are not checked)."""
    fixed = {k: v for k, v in entry.when.items() if k not in VERSION_KEYS and k not in (COMMIT_KEY, "tier")}
    return applies(Entry(entry.id, fixed, entry.error, entry.kind, entry.link, entry.reason), axes, env)
