"""--simplefsdp-bisect: after the run, each cell to bisect is run again on other versions of one package until the
window where its behaviour changes is found (versions.bisect). A probe is the cell on one version set, judged as any
cell (evidence, invariants, numerics against its baseline of that set), ``--simplefsdp-confirm`` times. Each
bisection leaves a markdown issue body beside the run (title, cell, signature, window, the reproducer with the
versions pinned, the failing rank's log tail), ready to file upstream, and its window for the known-failures
update."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from ..judge.identity import identity
from ..judge.results import CellResult
from ..kinds import Status
from ..machine import installed
from ..report.page import main_log
from ..spec.cells import rerun_command
from ..versions.bisect import FAILS, OTHER, PASSES, UNTESTABLE, bisect, judge_runs, table
from ..versions.git import GitError, compare_url, short_sha
from ..versions.sets import available_versions, cell_set, index_versions, order, wheel_versions
from ..words import release

# an error at start-up that says the versions do not fit together (the cell never trained): untestable, not a finding
API_MISMATCH = re.compile(
    r"ImportError|ModuleNotFoundError|cannot import name|has no attribute|unexpected keyword "
    r"argument|Unrecognized (option|arguments)"
)
DEFAULT_MINORS = 8  # the default list: the index's releases of the last 8 minor versions
MAX_SECOND = 2  # second regressions searched per bisection: each is a search of its own, probes cost minutes


class BisectError(ValueError):
    """A bisection that cannot start (a bad version list, no repository); the message says why."""


@dataclasses.dataclass
class Found:
    run: object
    cell: object  # the cell as it ran (its version set among its axes)
    record: dict  # its record in the run
    package: str
    bisection: object = None  # versions.bisect.Bisection
    issue: Path | None = None  # the markdown issue body written beside the run
    error: str = ""  # why it could not be bisected
    signature: str = ""  # what was bisected where not the record's own: a second regression met in the window
    failing: object = None  # that second regression's failing run (a CellResult), for its issue and draft
    # a compiler bisection's (session.compiling): the step named in words, the passes named, the failing run's pass
    # list and the pass its rank was inside when it failed, the search's wall
    named: str = ""
    culprits: list = dataclasses.field(default_factory=list)
    passes: list = dataclasses.field(default_factory=list)
    running: str = ""
    wall: float = 0.0


class Bisector:
    def __init__(self, state, package=None, spec=None, reuse=True):
        """``package`` and ``spec``: what to bisect over (default: --simplefsdp-bisect, --simplefsdp-bisect-versions);
        ``reuse``: the run's own record is the probe of its version (not where the cells were pinned otherwise)."""
        self.state, self.settings, self.reuse = state, state.settings, reuse
        self.package = package or self.settings.bisect
        self.spec = (self.settings.bisect_versions if spec is None else spec) or ""
        self.results = {}  # (cell id, version) -> the probe's runs (CellResult), for a second search's issue

    def to_bisect(self, records, selected):
        """[(run, cell, record)]: every new failure of the run; where the selection was narrowed (-k, node ids) every
        selected cell that failed, known failures too."""
        narrowed = bool(self.state.config.option.keyword or self.state.chosen)
        by_key = {(r.name, c.id): (r, c) for r, c in selected}
        out = []
        for rec in records:
            if rec["type"] != "cell" or rec.get("mutant") or (rec["matrix"], rec["id"]) not in by_key:
                continue
            failed = rec["status"] in (Status.FAILED, Status.XFAILED) and rec.get("failure_class")
            new = rec["status"] == Status.FAILED and not rec.get("known_failure")
            if failed and (new or narrowed):
                out.append((*by_key[(rec["matrix"], rec["id"])], rec))
        return out

    def versions(self, current: str) -> list[str]:
        """The ordered list to search: --simplefsdp-bisect-versions (a list, a range of the index's releases, a folder
        of wheels, an index URL, or GOOD..BAD commits), else the index's releases of the last minor versions."""
        spec = self.spec.strip()
        if self.package == "torchtitan" and ".." in spec:
            return [f"@{sha}" for sha in commits(self.settings.torchtitan_repo, spec)]  # (in the history's order)
        if spec.startswith(("http://", "https://")):
            found = index_versions(self.package, index=spec, timeout=60, prereleases=True)  # (nightlies)
        elif spec and Path(spec).is_dir():
            found = wheel_versions(Path(spec), self.package)
        elif spec and not re.search(r"[<>=!~]", spec):
            found = [v.strip() for v in spec.split(",") if v.strip()]
        else:
            releases = available_versions(self.package)
            if spec:
                try:
                    found = [v for v in releases if Version(v) in SpecifierSet(spec)]
                except InvalidSpecifier:
                    raise BisectError(
                        f"--simplefsdp-bisect-versions={spec}: not a list, range, folder, URL or GOOD..BAD"
                    ) from None
            else:
                newest = Version(releases[-1])
                found = [
                    v
                    for v in releases
                    if Version(v).release[:1] == newest.release[:1]
                    and Version(v).release[1] > newest.release[1] - DEFAULT_MINORS
                ]
        found = sorted(set(found) | {current}, key=order)
        return found

    def probe_for(self, run, cell, wanted):
        """probe(version) -> Probe: the cell on that version, --simplefsdp-confirm runs, each judged."""

        def probe(version):
            results = self.state.runs_on(run, cell, self.package, version, "bisect")
            self.results[(cell.id, version)] = results
            runs = [(*outcome(r, wanted), r.wall) for r in results]
            outside = next((r.outside_range for r in results if r.outside_range), [])
            return dataclasses.replace(judge_runs(version, runs), outside="; ".join(outside))

        return probe

    def run(self, records, selected) -> list[Found]:
        found = []
        for run, cell, rec in self.to_bisect(records, selected):
            current = cell_set(cell.axes).versions(installed_releases())[self.package]
            commit = (cell_set(cell.axes).get(self.package) or "").startswith("@")
            if self.package == "torchtitan" and commit and self.settings.torchtitan_repo:
                try:  # (the run's own cell is the probe of its commit: named as the list names it)
                    current = "@" + short_sha(self.settings.torchtitan_repo, current.lstrip("@"))
                except GitError:
                    pass
            item = Found(run, cell, rec, self.package)
            if rec.get("not_run"):  # no environment, not started: no behaviour of its own to bisect
                item.error = f"not bisected: {cell.id} did not run ({rec.get('error_line')})"
                found.append(item)
                continue
            try:
                versions = self.versions(current)
            except (BisectError, OSError, GitError, subprocess.CalledProcessError) as e:
                item.error = f"cannot bisect {cell.id}: {e}"
                found.append(item)
                continue
            wanted = rec.get("signature") or identity(CellResult.from_record(rec))
            known = (
                {}
                if current not in versions or not self.reuse
                else {
                    current: judge_runs(current, [(FAILS, wanted, rec.get("error_line") or "", rec.get("wall") or 0.0)])
                }
            )
            item.bisection = bisect(versions, self.probe_for(run, cell, wanted), known)
            item.issue = self.issue(item, wanted)
            found += [item, *self.second_searches(item, versions, wanted)]
        return found

    def second_searches(self, item, versions, wanted) -> list[Found]:
        """A window can hold more than one regression: a probe that failed with another signature is a bug of its
        own, searched for in turn between the list's start and the newest version that failed with it (the probes
        run so far reused, judged against that signature), and reported apart; at most MAX_SECOND, and not a
        numerics failure met while bisecting one (another parameter's drift is the same change seen elsewhere)."""
        out, searched = [], {wanted}
        queue = [item]
        while queue and len(out) < MAX_SECOND:
            probes = queue.pop(0).bisection.probes
            for other in [p for p in probes if p.outcome == OTHER and p.signature not in searched]:
                searched.add(other.signature)
                if kind_of(other.signature) == kind_of(wanted) == "numerics" or len(out) >= MAX_SECOND:
                    continue  # (another parameter drifting is the same numerics change seen elsewhere)
                newest = max(versions.index(p.version) for p in probes if p.signature == other.signature)
                known = {p.version: against(p, other.signature, wanted) for p in probes}
                run, cell = item.run, item.cell
                second = Found(run, cell, item.record, self.package, signature=other.signature)
                second.bisection = bisect(versions[: newest + 1], self.probe_for(run, cell, other.signature), known)
                window = second.bisection.window
                runs = self.results.get((cell.id, window[1] if window else other.version)) or []
                second.failing = next((r for r in runs if r.status != Status.PASSED), None)
                second.issue = self.issue(second, other.signature)
                out.append(second)
                queue.append(second)
        return out

    def issue(self, item, wanted) -> Path:
        """The markdown issue body beside the run: ready to file upstream."""
        b = item.bisection
        rec = item.failing.record() if item.failing is not None else item.record
        folder = self.state.run_dir / "bisect"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{item.cell.id}-{item.package}{'-' + slug_of(wanted) if item.signature else ''}.md"
        window = window_words(item, self.settings.torchtitan_repo)
        lines = [
            f"# {rec.get('error_line') or wanted} ({item.package} {window})",
            "",
            f"**Cell:** `{item.run.matrix.profile}::{item.cell.id}` ({item.run.target.name}, {item.cell.world} ranks)",
            f"**Signature:** `{wanted}`",
            f"**Window ({item.package}):** {window}",
            "",
            "| version | outcome | runs | signature or line | wall |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {' | '.join(str(x).replace('|', '/') for x in row)} |" for row in table(b)]
        # the failing side of the window (a regression fails on its second version, a fix on its first)
        first = next((p for p in b.probes if b.window and p.version in b.window and p.outcome == FAILS), None)
        # the failing side, portable: the plugin builds that version set's environment itself (uv), on any machine
        rerun = rerun_command(
            item.run.name, item.cell.id, item.cell.axes, item.run.matrix.tier, failing_set(item, first).label()
        )
        lines += [
            "",
            "## Reproducer",
            "",
            "In an environment with torchtitan and the plugin "
            f"(`pip install pytest-simplefsdp`; the failing side ran {', '.join(self.pins(item, first))}):",
            "",
            "```sh",
            rerun,
            "```",
            "",
            *log_section(rec),
        ]
        path.write_text("\n".join(lines))
        return path

    def pins(self, item, probe):
        """torch and torchtitan as the failing probe ran them: the set's pins, the installed versions for the rest."""
        vset = failing_set(item, probe)
        ran = vset.versions(installed_releases())
        return [
            f"{p}@{ran[p]}" if (vset.get(p) or "").startswith("@") else f"{p}=={ran[p]}"
            for p in ("torch", "torchtitan")
        ]


def log_section(rec) -> list[str]:
    """An issue body's last section: the last lines of the failing rank's log of a cell record."""
    log = main_log(rec)
    tail = Path(log).read_text(errors="replace").splitlines()[-30:] if log and Path(log).is_file() else []
    return ["## The failing rank's log (last lines)", "", "```", *tail, "```", ""]


def against(probe, signature, before):
    """A probe judged against another signature: one that failed with it fails, one that failed with the signature
    searched before is another error (a flaky or untestable probe stays what it was)."""
    if probe.outcome not in (FAILS, OTHER):
        return probe
    outcome = FAILS if probe.signature == signature else OTHER
    return dataclasses.replace(probe, outcome=outcome, runs=[outcome] * len(probe.runs))


def kind_of(signature) -> str:
    """What a signature is of: its text before the first colon ("numerics", an exception's type, a signal)."""
    return signature.split(":", 1)[0].strip()


def slug_of(signature) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", signature)[:40].strip("-")


def failing_set(item, probe):
    """The version set the failing probe ran (the cell's own, with the bisected package pinned to its version)."""
    vset = cell_set(item.cell.axes)
    return vset if probe is None else vset.with_pin(item.package, probe.version)


def installed_releases() -> dict:
    """torch and torchtitan of the environment pytest runs in, as a release list names them (no local tag)."""
    return {"torch": release(installed("torch")), "torchtitan": installed("torchtitan")}


def outcome(result, wanted) -> tuple:
    """(outcome, signature, line) of one run of a probe against the signature being bisected."""
    if result.status == Status.PASSED:
        return PASSES, "", ""
    sig = result.signature or identity(result)
    line = result.error_line or ""
    if result.not_run or result.culprit:  # no environment for the version, or its seed checkpoint or baseline
        return UNTESTABLE, sig, line  # failed: no behaviour of the cell's own (asked before the signature)
    if sig == wanted:
        return FAILS, sig, line
    if not result.losses and API_MISMATCH.search(line):
        return UNTESTABLE, sig, line
    return OTHER, sig, line


def window_words(found: Found, repo=None) -> str:
    """The window in words, as cargo-bisect-rustc says it: "regressed in X (last good W)" or "fixed in X (last
    failing W)", with GitHub's compare page for torchtitan commits of a checkout on GitHub; else why there is none."""
    b = found.bisection
    if not b or not b.window:
        return b.message if b else found.error
    before, after = b.window
    fails = {p.version: p.outcome for p in b.probes}.get(after) == FAILS
    words = f"regressed in {after} (last good {before})" if fails else f"fixed in {after} (last failing {before})"
    link = compare_url(repo, before.lstrip("@"), after.lstrip("@")) if repo and after.startswith("@") else None
    return words + (f": {link}" if link else "")


def bisect_record(found: Found, repo=None) -> dict:
    """A bisection as the run's document keeps it: the cell, the package, the window in words and every probe (or
    why it could not run)."""
    cell = f"{found.run.matrix.profile}::{found.cell.id}"
    if found.error:
        return {"cell": cell, "package": found.package, "error": found.error}
    compiler = (
        {"culprits": found.culprits, "passes": found.passes, "running": found.running, "wall": round(found.wall, 1)}
        if found.named
        else {}
    )
    return {
        "cell": cell,
        "package": found.package,
        **({"second_regression": found.signature} if found.signature else {}),
        "issue": str(found.issue),
        "found": window_words(found, repo),
        **compiler,
        **found.bisection.record(),
    }


def window_of(found: Found) -> dict:
    """The known-failures window a bisection found: the first version failing with the signature and the last one
    passing, by the order of the list (a fix found: fixed_in)."""
    b = found.bisection
    if not b or not b.window:
        return {}
    outcomes = {p.version: p.outcome for p in b.probes}
    before, after = b.window
    strip = lambda v: v.lstrip("@")  # noqa: E731 - a commit is written without its marker
    if outcomes.get(after) == FAILS:
        return {"first_failing": {found.package: strip(after)}, "last_passing": {found.package: strip(before)}}
    return {"fixed_in": {found.package: strip(after)}}


def commits(repo, spec) -> list[str]:
    """GOOD..BAD of a git checkout, oldest first, GOOD included (first-parent history: the merges the branch saw)."""
    if not repo:
        raise BisectError(
            "--simplefsdp-bisect=torchtitan over commits needs a torchtitan checkout: run in it, or "
            "name it with --simplefsdp-torchtitan-repo=PATH"
        )
    if ".." not in spec:
        raise BisectError(f"--simplefsdp-bisect-versions={spec!r}: name the commits as GOOD..BAD")
    good, _, bad = spec.partition("..")
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "rev-list",
            "--reverse",
            "--first-parent",
            "--abbrev-commit",
            "--abbrev=12",
            f"{good}..{bad}",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [short_sha(repo, good), *listed]
