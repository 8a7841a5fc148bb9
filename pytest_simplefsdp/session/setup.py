"""What a matrix session reads before the first cell: the launcher, the matrix files (loaded, expanded, bound to
the installed torchtitan), the cells named on the command line, the known failures (checked against every
profile, once per content key), and what the machine and the other plugins allow."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..judge import mutants
from ..judge.gate import Base
from ..judge.known import ENV_KEYS, could_apply, load_known_failures, scope_problem
from ..kinds import Device, RecordType
from ..launch.builtin import LAUNCHERS
from ..machine import code_identity, cuda_device_ids, installed, source_checkout, vcs_commit
from ..options import MERGE_BASE, NEWEST
from ..paths import KNOWN_FAILURES, PACKAGE, cache_root, write_json
from ..spec.cells import named_by
from ..spec.footprint import file_changes
from ..spec.matrix import SourceUnavailable
from ..spec.profiles import MatrixRun, matrix_files, shipped, shipped_path
from ..spec.upstream import UPSTREAM_AXES
from ..store.runs import RunError, load_run
from ..versions.git import GitError, git, is_checkout, merge_base, short_sha
from ..versions.sets import INSTALLED, available_versions, parse
from ..words import did_you_mean
from ..yamlio import MatrixError, parse_yaml, plain


def make_launcher(config, dry_run):
    name = config.getoption("simplefsdp_launcher") or config.getini("simplefsdp_launcher")
    launcher = config.hook.pytest_simplefsdp_make_launcher(config=config, name=name, dry_run=dry_run)
    if launcher is None:
        raise pytest.UsageError(
            f"--simplefsdp-launcher: unknown launcher {name!r}; built in: "
            f"{', '.join([*LAUNCHERS, 'slurm'])} (plugins add more: pytest_simplefsdp_make_launcher)"
            + did_you_mean(name, [*LAUNCHERS, "slurm"])
        )
    return launcher


def load_runs(config, s, files, cache_dir):
    """The session's matrix files, loaded, expanded, and bound to what is installed."""
    try:
        runs = [
            MatrixRun(p, config, cache_dir, s.tier, s.version_sets) for p in (files or matrix_files(s, config.rootpath))
        ]
        for run in runs:
            problem = run.target.check_installed()
            if problem and not s.dry_run:
                raise pytest.UsageError(problem)
            if (
                not problem
            ):  # flags spelled the way the installed torchtitan takes them (a dry run elsewhere: unchecked)
                run.bind()
    except (MatrixError, RuntimeError) as e:
        raise pytest.UsageError(str(e)) from None
    return runs


def known_failures_path(config, s):
    """--simplefsdp-known-failures, else the rootdir's known_failures.yaml, else the shipped one."""
    if s.known_failures is not None:
        return s.known_failures
    own = config.rootpath / "known_failures.yaml"
    return own if own.exists() else KNOWN_FAILURES


def load_known(config, s, runs, cache_dir):
    """The known failures, each entry checked to be able to match a valid cell of some profile: the shipped ones
    (in the real tier, since a tier's rules may drop more) or one this session runs. Expanding every shipped profile
    for that check is most of a session's start (millions of excludes on the GPU profiles), so their valid cells are
    kept per content key (``shipped_key``: the shipped profiles, the plugin's code, the installed torchtitan), the
    same for every known-failures file (an edited file is checked against them in milliseconds); the session's own
    matrices are checked every time (their cells are already expanded)."""
    path = known_failures_path(config, s)
    facts = shipped_cells(config, cache_dir)
    axis_names = set(facts["axes"]) | {a for r in runs for a in r.matrix.axes}
    names = set(facts["profiles"]) | {r.matrix.profile for r in runs}
    try:
        known = load_known_failures(path, axis_names, profiles=names)
        for entry in known.entries:
            named = entry.when.get("profile")
            named = set(named if isinstance(named, list) else [named]) if named else set()
            if entry.foreign or (named and named <= set(facts["unloadable"])):
                continue  # its profiles are not loaded (or cannot be, here)
            if any(could_apply(entry, axes, env) for env, cells in facts["cells"] for axes in cells):
                continue  # it matches a shipped cell
            tests = entry.when.get("upstream")
            if tests and not set(tests if isinstance(tests, list) else [tests]) & set(facts["upstream_tests"]):
                continue  # upstream tests the installed torchtitan does not have (an older main): none to match here
            if not any(could_apply(entry, c.axes, r.env(c.axes)) for r in runs for c in r.cells):
                raise MatrixError(
                    f"{entry.where}: entry {entry.id!r} matches no valid cell of any profile "
                    f"({', '.join(sorted(names))})"
                )
        check_scopes(known, runs)
    except MatrixError as e:
        raise pytest.UsageError(str(e)) from None
    return known


def shipped_cells(config, cache_dir) -> dict:
    """The shipped profiles, expanded once per ``shipped_key`` (cached under the per-user cache): their axes and
    names, the ones that cannot load here, the upstream tests they list, and each one's valid cells (axes) with what
    an entry's conditions may name of their environment besides versions (``could_apply`` checks no version)."""
    cached = cache_root() / "known-check" / f"shipped-{shipped_key(config)}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    profiles, unloadable = [], set()
    for p in shipped(config.rootpath).values():
        try:
            profiles.append(MatrixRun(p, config, cache_dir))
        except SourceUnavailable:
            unloadable.add(p.stem)  # an upstream-sourced profile whose torchtitan is not installed here
        except MatrixError as e:  # a broken shipped profile is an error, not an unknown axis later
            raise pytest.UsageError(f"a shipped profile does not load: {e}") from None
    facts = {
        "axes": sorted({a for r in profiles for a in r.matrix.axes} | UPSTREAM_AXES),
        "profiles": sorted({r.matrix.profile for r in profiles} | unloadable),
        "unloadable": sorted(unloadable),
        "upstream_tests": sorted({t for r in profiles for t in (r.matrix.upstream or {})}),
        "cells": [
            ({k: v for k, v in r.env().items() if k in ENV_KEYS}, [plain(c.axes) for c in r.cells]) for r in profiles
        ],
    }
    return json.loads(write_json(cached, facts))  # (as a later session reads it: JSON's types, not the profiles')


def check_scopes(known, runs):
    """Every entry that could match a cell of this session scopes torchtitan the way the cell's torchtitan is
    installed (a release range for a release, a commit range for a commit) and names commits its checkout has: a
    MatrixError naming the entry's file and line, never a range that silently matches main's "0.2.2"."""
    for run in runs:
        by_set = {}  # one environment per version set
        for cell in run.cells:
            by_set.setdefault(cell.axes.get("versions", INSTALLED), []).append(cell)
        for cells in by_set.values():
            env = run.env(cells[0].axes)
            for entry in known.entries:
                problem = any(could_apply(entry, c.axes, env) for c in cells) and scope_problem(entry, env)
                if problem:
                    raise MatrixError(f"{entry.where}: entry {entry.id!r}: {problem}")


def shipped_key(config) -> str:
    """What the shipped profiles' valid cells depend on: every shipped profile's file, the plugin's own code, the
    installed torchtitan (whether the upstream-sourced profiles load), and the source of every other plugin that can
    change targets or cells (a conftest's pytest_simplefsdp_modify_cells)."""
    h = hashlib.sha256()
    files = [*shipped(config.rootpath).values(), *sorted(PACKAGE.rglob("*.py"))]
    for hook in (config.hook.pytest_simplefsdp_modify_cells, config.hook.pytest_simplefsdp_make_target):
        files += [Path(i.plugin.__file__) for i in hook.get_hookimpls() if getattr(i.plugin, "__file__", None)]
    for f in sorted(set(files)):
        h.update(f"{f}\0".encode())
        h.update(f.read_bytes() if f.is_file() else b"-")
    # the installed torchtitan: main of any month says 0.2.2, so its code too (which upstream tests it has)
    h.update(f"{installed('torchtitan')}\0{code_identity()}".encode())
    return h.hexdigest()[:20]


def check_versions(s, runs) -> list[str]:
    """The version sets the cells run on, each pinned version checked against the index's releases: an unknown one
    is a usage error naming it and the versions the index has. An index that cannot be reached checks nothing (the
    environment's build then fails as infra, with the installer's line). Returns header lines."""
    labels = {v for run in runs for v in run.matrix.axes.get("versions", [])} - {INSTALLED}
    pins = {(p, v) for label in labels for p, v in parse(label).pins if not v.startswith("@")}
    known, lines = {}, []
    for package, version in sorted(pins):
        if package not in known:
            try:
                known[package] = available_versions(package)
            except (OSError, ValueError) as e:
                known[package] = None
                lines.append(
                    f"simplefsdp: the package index could not be asked for {package}'s releases ({e}); "
                    f"its version sets are checked when their environments are built"
                )
        if known[package] is not None and version not in known[package]:
            near = ", ".join(known[package][-12:])
            raise pytest.UsageError(
                f"version set {package}=={version}: the index has no {package} {version}; its releases: {near}"
            )
    return lines + [
        f"simplefsdp: version sets: {', '.join(sorted(labels))} (environments under "
        f".simplefsdp/envs/, built with uv where none is kept)"
    ] * bool(labels)


def torchtitan_checkout(config, s) -> Path | None:
    """The torchtitan git checkout whose commits the run names (a PR's base, ``torchtitan@<commit>`` sets, a
    bisection's range): --simplefsdp-torchtitan-repo, else the one torchtitan is installed editable from, else the
    rootdir where it is one (a run started in the checkout), else None."""
    candidates = [s.torchtitan_repo, source_checkout("torchtitan"), config.rootpath]
    return next((Path(c) for c in candidates if c is not None and is_checkout(c)), None)


def resolve_base(config, s):
    """--simplefsdp-base: the commit failures are rerun on (judge.gate.Base), in the checkout it names: the
    --simplefsdp-torchtitan-repo, else the one torchtitan is installed editable from, else the rootdir. None without
    the option; a usage error for a ref that names no commit, or names the commit the installed torchtitan is."""
    if not s.base:
        return None
    repo = s.torchtitan_repo  # (torchtitan_checkout's, where the option names none)
    if repo is None:
        tried = ", ".join(str(c) for c in (source_checkout("torchtitan"), config.rootpath) if c)
        raise pytest.UsageError(
            f"--simplefsdp-base={s.base}: no torchtitan git checkout to take it from (tried "
            f"{tried}); run in your torchtitan checkout or name it with "
            f"--simplefsdp-torchtitan-repo=PATH"
        )
    editable = source_checkout("torchtitan") == repo  # (then the PR is its working tree)
    try:
        ref, commit = merge_base(repo) if s.base == MERGE_BASE else (s.base, short_sha(repo, s.base))
        running = vcs_commit("torchtitan") or (short_sha(repo, "HEAD") if editable else None)
        dirty = editable and bool(git(repo, "status", "--porcelain", "--", "torchtitan"))
    except GitError as e:
        raise pytest.UsageError(f"--simplefsdp-base={s.base}: {e}") from None
    if running and running.startswith(commit) and not dirty:
        raise pytest.UsageError(
            f"--simplefsdp-base={s.base}: {commit} is the commit the installed torchtitan runs "
            f"(nothing to compare with); name the PR's base"
        )
    return Base(ref, commit, str(repo), base_entries(repo, commit, known_failures_path(config, s)))


def base_entries(repo, commit, path) -> tuple | None:
    """The entry ids of the known-failures file ``path`` as the base ``commit`` has it, where the file is part of
    the checkout ``repo`` (an empty tuple where the base has no such file); None where it is not part of it: one
    file then judges both sides."""
    try:
        rel = Path(path).resolve().relative_to(Path(repo).resolve())
    except ValueError:
        return None
    try:
        text = git(repo, "show", f"{commit}:{rel.as_posix()}")
    except GitError:
        return ()  # the base has no such file: every entry is the PR's
    try:
        doc = plain(parse_yaml(text, f"{rel} at {commit}"))
    except MatrixError:
        return ()
    if not isinstance(doc, list):
        return ()
    return tuple(str(e["id"]) for e in doc or [] if isinstance(e, dict) and e.get("id") is not None)


@dataclass(frozen=True)
class Changed:
    """--simplefsdp-changed: the checkout's changes since a commit (spec.paths and spec.footprint map them)."""

    ref: str
    commit: str
    repo: str
    changes: tuple  # spec.footprint.FileChange, each

    def about(self) -> dict:
        return {"ref": self.ref, "commit": self.commit, "repo": self.repo}


def changes_since(repo, commit, until=None) -> tuple:
    """The checkout's changes since ``commit`` (``git diff -M -U0`` against the working tree and the files git does
    not track yet; ``until``: against that commit instead), each with what of it changed (spec.footprint)."""
    text = git(repo, "diff", "-M", "-U0", "--no-color", "--no-ext-diff", commit, *([until] if until else []))
    untracked = [] if until else git(repo, "ls-files", "--others", "--exclude-standard").splitlines()

    def at(rev):
        def read(path):
            try:
                return git(repo, "show", f"{rev}:{path}", raw=True)
            except GitError:
                return None

        return read

    def worktree(path):
        try:
            return (Path(repo) / path).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    return tuple(file_changes(text, at(commit), at(until) if until else worktree, [f for f in untracked if f]))


def resolve_changed(s, base) -> Changed | None:
    """--simplefsdp-changed: what changed in the checkout since REF (bare: the PR's base, else the merge base of
    HEAD with main): the diff against the working tree, and files git does not track yet."""
    if not s.changed:
        return None
    repo = s.torchtitan_repo
    if repo is None:
        raise pytest.UsageError(
            f"--simplefsdp-changed={s.changed}: no torchtitan git checkout to diff (run in your "
            f"torchtitan checkout or name it with --simplefsdp-torchtitan-repo=PATH)"
        )
    try:
        if s.changed == MERGE_BASE:
            ref, commit = (base.ref, base.commit) if base is not None else merge_base(repo)
        else:
            ref, commit = s.changed, short_sha(repo, s.changed)
        changes = changes_since(repo, commit)
    except GitError as e:
        raise pytest.UsageError(f"--simplefsdp-changed={s.changed}: {e}") from None
    return Changed(ref, commit, str(repo), changes)


def cell_arguments(config):
    """Positional arguments in matrix mode: matrix files, or cells as a FAILED line names them
    (``matrix/cpu.yaml::llama3-dp2-eager``, pasted back; a shipped profile's from any rootdir). Ordinary test
    paths are refused: this mode runs the matrix only. Returns {matrix path: cell ids (empty: all its cells)}."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return {}
    chosen = {}
    for arg in config.args:
        file, _, cell = arg.partition("::")
        file = file.removesuffix("[trace]")
        path = next(
            (b / file for b in (config.invocation_params.dir, config.rootpath) if (b / file).is_file()), None
        ) or shipped_path(file)
        if path is None or path.suffix not in (".yaml", ".yml"):
            raise pytest.UsageError(
                f"{arg}: not a matrix file or a cell of one; --simplefsdp-matrix runs the "
                f"matrix only (drop it to run test files)"
            )
        ids = chosen.setdefault(path.resolve(), set())
        if not cell:
            chosen[path.resolve()] = ids = None  # the whole file
        if ids is not None:
            ids.add(cell)
    config.args[:] = [str(config.invocation_params.dir)]  # nothing for pytest to collect: the cells are ours
    return {p: ids or set() for p, ids in chosen.items()}


def check_named(chosen, runs):
    """Cells named on the command line that no loaded matrix has: refused before anything is collected, each with
    the nearest id it has."""
    for run in runs:
        named = chosen.get(run.matrix.path.resolve())
        if not named:
            continue
        ids = set().union(*(named_by(run.matrix, c) for c in run.cells)) if run.cells else set()
        unknown = sorted(n for n in named if n.split("[mutant-")[0] not in ids)
        if unknown:
            hints = "".join(did_you_mean(n, ids) for n in unknown)
            raise pytest.UsageError(
                f"{run.matrix.path}: no valid cell {', '.join(unknown)}{hints} (--simplefsdp-dry-run lists its cells)"
            )


def check_plugins(config, s):
    """Plugins that would fight the matrix's own mechanisms: refused with the way out, or told in the header.
    pytest-rerunfailures would run a cell again over its own folder and store it twice; pytest-timeout would
    interrupt the controller mid-cell (a traceback, the cell's record lost) where the supervisor times it.
    Returns (header lines, whether cells are exempt from an ini pytest-timeout)."""
    reruns = getattr(config.option, "reruns", None)
    if reruns:
        raise pytest.UsageError(
            f"--reruns {reruns} (pytest-rerunfailures): a matrix cell is not rerun; a cell "
            f"that fails now and then is a `kind: flaky` entry in the known failures"
        )
    if getattr(config.option, "timeout", None):
        raise pytest.UsageError(
            f"--timeout {config.option.timeout:g} (pytest-timeout): a cell is timed by its "
            f"supervisor, which dumps the ranks' stacks and keeps the record: use "
            f"--simplefsdp-timeout={config.option.timeout:g}"
        )
    if config.pluginmanager.hasplugin("timeout") and float(config.getini("timeout") or 0) > 0:
        return [
            f"simplefsdp: the ini timeout ({config.getini('timeout')} s, pytest-timeout) does not apply to cells: "
            f"each has its own (--simplefsdp-timeout, else the matrix file's `timeout`)"
        ], True
    return [], False


def check_gpus(runs, runner):
    """A GPU profile on a host with fewer GPUs is still collected (--co, -k work anywhere); its cells are
    skipped with the reason. Returns run name -> why its cells cannot run here."""
    have, out = len(cuda_device_ids()), {}
    for run in runs:
        if run.matrix.device == Device.CUDA and not runner.launcher_for(run).remote:
            need = max((run.processes(c) for c in run.cells), default=0)
            if have < need:
                out[run.name] = (
                    f"profile {run.matrix.profile} needs {need} CUDA devices, {have} visible "
                    f"(--simplefsdp-dry-run lists its commands; --simplefsdp-tier=trace runs it here)"
                )
    return out


def stored_run(path, option, runs=(), runs_dirs=()):
    """(what it is, the run) of a stored run an option names, read now: a bad file is found before any cell runs.
    ``newest`` (a bare --simplefsdp-compare): the newest results.jsonl under ``runs_dirs`` with a profile of ``runs``."""
    if path is None:
        return None
    if path == NEWEST:
        path = newest_run(runs, runs_dirs)
        if path is None:
            raise pytest.UsageError(
                f"--simplefsdp-{option}: no stored run of profile "
                f"{', '.join(sorted({r.matrix.profile for r in runs}))} under "
                f"{', '.join(map(str, runs_dirs))}; name a run's file"
            )
    try:
        return str(path), load_run(path)
    except (OSError, RunError) as e:
        raise pytest.UsageError(f"--simplefsdp-{option}: {e}") from None


def newest_run(runs, runs_dirs):
    """The newest stored results.jsonl whose meta records name a profile of ``runs`` (pytest-benchmark's bare
    --benchmark-compare), or None."""
    profiles = {r.matrix.profile for r in runs}
    found = sorted(
        {p for d in runs_dirs for p in Path(d).glob("*/results.jsonl")}, key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in found:
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == RecordType.META and rec.get("profile") in profiles:
                return path
    return None


def chosen_mutants(s, runs):
    """run name -> [judge.mutants.Mutant] of --simplefsdp-mutants."""
    if not s.mutants:
        return {}
    chosen = {}
    for run in runs:
        try:
            chosen[run.name] = mutants.parse_names(s.mutants, run.target.MUTANTS)
        except ValueError as e:
            raise pytest.UsageError(f"--simplefsdp-mutants: {run.name} (target {run.target.name}): {e}") from None
    return chosen
