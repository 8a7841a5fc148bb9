"""The pytest plugin: options, one test item per matrix cell, outcomes, table and stored results.

Without ``--simplefsdp-matrix`` (or ini ``simplefsdp_matrix = true``) it adds nothing to a run.
Pipeline: matrix -> cells -> launch -> results -> (verdict) -> report.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from . import mutants, report
from .cells import Cell, cell_id, expand, id_parts, value_id, world_size
from .evidence import probe_folder
from .launch import LAUNCHERS, LaunchOutcome, LaunchSpec, become_subreaper, free_port, kill_procs, session_leftovers
from .launch_slurm import SlurmLauncher, SlurmOptions, check_cluster
from .matrix import MatrixError, load_matrix, with_tier
from .numerics import compare, compare_params, lane_for, mismatch_line, param_line, plot, read_param_stats
from .results import CellResult, build_result
from .schedule import Packer
from .verdict import could_apply, judge, load_known_failures, signature, update_file
from .targets import ROOT, make_target

MATRIX_DIR = ROOT / "matrix"
DEFAULT_TIMEOUT = 900.0
COLUMN_AXES = ("compile", "backend", "memory_policy")

# name, ini type, default, help. CLI --simplefsdp-<name> ; ini simplefsdp_<name>.
OPTIONS = [
    ("matrix", "bool", False, "run the SimpleFSDP composability matrix: one test per valid cell "
                              "(ordinary test files are not collected in this mode)"),
    ("profile", "string", "auto", "profile(s) to run, comma-separated: a file name in matrix/ without .yaml "
                                  "(cpu, h100x8, titan02-cpu, titan02-h100x8), 'all', or 'auto' (the installed "
                                  "torchtitan generation's h100x8 profile where 8 CUDA devices are visible, "
                                  "else its cpu profile)"),
    ("matrix-file", "args", [], "matrix YAML file(s) to run instead of --simplefsdp-profile (repeatable)"),
    ("timeout", "string", None, "per-cell timeout in seconds (default: the matrix file's `timeout`, else 900); "
                                "a cell past it is stack-dumped, killed and reported as a hang"),
    ("tier", "string", "real", "real: every rank runs (the profile's device); trace: each cell is one "
                               "simulated rank on this CPU machine (torchtitan's fake backend): config, "
                               "parallelisation, tracing and one step are judged, numerics are not"),
    ("dry-run", "bool", False, "collect the cells and print each one's exact command and environment; "
                               "launch nothing"),
    ("json", "string", None, "write the run (one record per cell: id, axes, status, losses per step, "
                             "first error line, failing rank, wall time, log dir) to this JSON file"),
    ("launcher", "string", "torchrun", "how ranks are started: torchrun (reference), local (the runner "
                                       "starts each rank with torchrun's environment), fork (a server "
                                       "imports torch and the target once and forks the ranks of every cell) "
                                       "or slurm (every cell is one srun job step; see --simplefsdp-slurm-*)"),
    ("slurm-partition", "string", None, "slurm launcher: the partition the cells' steps run in (srun --partition)"),
    ("slurm-account", "string", None, "slurm launcher: the account charged (srun --account)"),
    ("slurm-args", "string", None, "slurm launcher: more srun options, as one shell-quoted string "
                                   "(e.g. \"--qos=high --cpus-per-task=16\")"),
    ("slurm-ranks-per-node", "string", None, "slurm launcher: most ranks one node runs; larger cells span "
                                             "nodes (default: 8 for GPU profiles, one node for CPU profiles)"),
    ("slurm-queue-timeout", "string", "3600", "slurm launcher: seconds a cell may wait in SLURM's queue before "
                                              "it is withdrawn and reported as not scheduled (its --simplefsdp-"
                                              "timeout counts from the step's start)"),
    ("artifacts", "string", None, "folder for per-cell logs and results (default: .simplefsdp/runs/<time> "
                                  "under the rootdir)"),
    ("jobs", "string", "1", "cells run at once: N or auto (as many as the ranks budget or the visible GPUs "
                            "allow); GPU cells get disjoint CUDA_VISIBLE_DEVICES, CPU cells share a budget of "
                            "--simplefsdp-max-ranks ranks (default: the cores)"),
    ("log-limit", "string", "512", "MB of logs a cell may write (all ranks together); past it the cell is "
                                   "stopped and its logs cut"),
    ("max-ranks", "string", None, "most ranks one CPU cell may start on this machine (default: one per GB of "
                                  "available memory); a larger cell fails without launching"),
    ("status-md", "string", None, "write the status table (GitHub markdown, one grid per profile and model, "
                                  "footnotes with known-failure links) to this file"),
    ("compare", "string", None, "a stored run (--simplefsdp-json) to compare with: newly broken, newly fixed "
                                "and changed-signature cells are listed and marked in the status table"),
    ("baseline", "string", None, "take numerics baselines from this stored run (--simplefsdp-json output) "
                                 "instead of running them"),
    ("known-failures", "string", None, "known-failures YAML (default: known_failures.yaml in the rootdir, "
                                       "else the one shipped with the plugin)"),
    ("gate", "bool", False, "merge-gate mode: a known failure that passes (XPASS) fails the run and names "
                            "the entry to delete"),
    ("mutants", "string", None, "the mutation tier instead of the cells: re-inject named bugs (all, or "
                                "comma-separated names) into every selected cell each applies to; an item passes "
                                "when the gate kills its mutant and fails when the mutant survives"),
    ("update-known-failures", "bool", False, "after the run, rewrite the known-failures file: add entries "
                                             "for new failures (link: TODO), remove entries whose cells all "
                                             "passed; other entries, their order and comments are kept"),
]


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("simplefsdp", "SimpleFSDP composability matrix (pytest-simplefsdp)")
    for name, kind, default, help_text in OPTIONS:
        dest = "simplefsdp_" + name.replace("-", "_")
        if kind == "bool":
            group.addoption(f"--simplefsdp-{name}", action="store_true", default=None, dest=dest, help=help_text)
        elif kind == "args":
            group.addoption(f"--simplefsdp-{name}", action="append", default=None, dest=dest, metavar="PATH",
                            help=help_text)
        else:
            group.addoption(f"--simplefsdp-{name}", default=None, dest=dest, help=help_text + f" [ini: {dest}]")
        parser.addini(dest, help=help_text, type=kind, default=default)


def option(config, name):
    dest = "simplefsdp_" + name.replace("-", "_")
    value = config.getoption(dest)
    return value if value is not None else config.getini(dest)


def pytest_configure(config):
    config.addinivalue_line("markers", "simplefsdp: a cell of the SimpleFSDP composability matrix")
    config.addinivalue_line("markers", "smoke: the small tier of matrix cells that CI runs (pytest -m smoke)")
    config.addinivalue_line("markers", "simplefsdp_cell(cell_id, matrix=PATH or profile=NAME, mutant=None): the "
                                       "matrix cell the simplefsdp_cell fixture runs for this test")
    if option(config, "matrix"):
        config.pluginmanager.register(Builtins(), "simplefsdp-builtins")
        become_subreaper()  # orphans that shed the cell's marker come back to us (see launch)
        config.pluginmanager.register(MatrixSession(config), "simplefsdp-session")
        signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum, frame):
    """SIGTERM acts like Ctrl-C: the running cell's ranks are killed, finished results are kept."""
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


def _write_command(spec, launcher):
    """command.txt: the one line that reruns the cell alone, outside pytest."""
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    (spec.log_dir / "command.txt").write_text(launcher.reproducer(spec) + "\n")


def render_trace(trace_dir: Path, out: Path):
    """tlparse's multi-rank HTML of a TORCH_TRACE folder, where tlparse is installed."""
    exe = shutil.which("tlparse") or shutil.which("tlparse", path=str(Path(sys.executable).parent))
    if not exe or not any(trace_dir.iterdir()):
        return None
    import subprocess

    try:
        subprocess.run([exe, str(trace_dir), "--all-ranks-html", "-o", str(out), "--overwrite", "--no-browser"],
                       capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    index = out / "index.html"
    return str(index) if index.exists() else None


def _key(axes):
    return tuple(sorted(axes.items()))


def _number(config, name, default=0):
    """A positive number option, or ``default`` when unset; anything else is a usage error."""
    value = option(config, name)
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except ValueError:
        raise pytest.UsageError(f"--simplefsdp-{name}: not a number: {value!r}") from None
    if not (number > 0 and math.isfinite(number)):
        raise pytest.UsageError(f"--simplefsdp-{name} must be a positive finite number, got {value}")
    return number


def _installed(package):
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _cuda_device_ids():
    """The GPUs cells may use: CUDA_VISIBLE_DEVICES where it is set, else every GPU nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(_nvidia_smi_gpus())]


def _cuda_devices():
    return len(_cuda_device_ids())


def _nvidia_smi_gpus():
    if not shutil.which("nvidia-smi"):
        return 0
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Builtins:
    """The built-in targets and launchers, as implementations of our own hooks (asked last)."""

    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_target(self, matrix, cache_dir):
        return make_target(matrix, cache_dir)

    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_launcher(self, config, name, dry_run):
        if name in LAUNCHERS:
            return LAUNCHERS[name]()
        return _slurm_launcher(config, dry_run) if name == "slurm" else None


def _launcher(config, dry_run):
    name = option(config, "launcher")
    launcher = config.hook.pytest_simplefsdp_make_launcher(config=config, name=name, dry_run=dry_run)
    if launcher is None:
        raise pytest.UsageError(f"--simplefsdp-launcher: unknown launcher {name!r}; built in: "
                                f"{', '.join([*LAUNCHERS, 'slurm'])} (plugins add more: pytest_simplefsdp_make_launcher)")
    return launcher


def _slurm_launcher(config, dry_run):
    try:
        extra = shlex.split(option(config, "slurm-args") or "")
    except ValueError as e:
        raise pytest.UsageError(f"--simplefsdp-slurm-args: {e}: {option(config, 'slurm-args')!r}") from None
    per_node = _number(config, "slurm-ranks-per-node", None)
    if per_node is not None and per_node != int(per_node):
        raise pytest.UsageError(f"--simplefsdp-slurm-ranks-per-node: not a whole number: {per_node}")
    options = SlurmOptions(option(config, "slurm-partition"), option(config, "slurm-account"), extra,
                           int(per_node) if per_node else None, _number(config, "slurm-queue-timeout", 3600))
    problem = None if dry_run else check_cluster(options)
    if problem:
        raise pytest.UsageError(problem)
    return SlurmLauncher(options)


def matrix_files(config):
    files = option(config, "matrix-file")
    if files:
        return [Path(f) for f in files]
    known = {p.stem: p for p in sorted(MATRIX_DIR.glob("*.yaml"))}
    wanted = [p.strip() for p in str(option(config, "profile")).split(",") if p.strip()]
    out = []
    for name in wanted:
        if name == "all":
            out.extend(known.values())
        elif name == "auto":  # the installed generation's profile for this machine
            prefix = "titan02-" if _installed("torchtitan").startswith("0.2.") else ""
            out.append(known[prefix + ("h100x8" if _cuda_devices() >= 8 else "cpu")])
        elif name in known:
            out.append(known[name])
        else:
            raise pytest.UsageError(f"--simplefsdp-profile: unknown profile {name!r}; "
                                    f"known: auto, all, {', '.join(known)}")
    return out


def _labels(matrix, axes):
    """(row, column) labels for the table: columns are compile × backend × memory policy."""
    col_axes = [a for a in matrix.axes if a in COLUMN_AXES] or [list(matrix.axes)[-1]]
    parts = id_parts(matrix, axes)
    row = " ".join(parts[a] for a in matrix.axes if a not in col_axes and parts[a]) or "-"
    col = " ".join(parts[a] for a in col_axes if parts[a]) or "-"
    return row, col


class MatrixRun:
    """One matrix file's cells, target and results."""

    def __init__(self, path, config, cache_dir, tier="real"):
        self.matrix = with_tier(load_matrix(path), tier)
        self.target = config.hook.pytest_simplefsdp_make_target(matrix=self.matrix, cache_dir=cache_dir)
        self.cells, self.dropped = expand(self.matrix)
        config.hook.pytest_simplefsdp_modify_cells(config=config, matrix=self.matrix, cells=self.cells,
                                                   dropped=self.dropped)
        rel = Path(os.path.relpath(self.matrix.path.resolve(), config.rootpath))
        self.name = str(rel) if not str(rel).startswith("..") else self.matrix.path.name
        if tier != "real":
            self.name += f"[{tier}]"
        self.prepared = False

    def meta(self, launcher):
        return {"type": "meta", "matrix": self.name, "profile": self.matrix.profile,
                "target": self.target.name, "device": self.matrix.device, "launcher": launcher,
                "versions": versions(), "date": datetime.date.today().isoformat(),
                "cells": len(self.cells), "dropped_cells": len(self.dropped), "tier": self.matrix.tier,
                "columns": list(dict.fromkeys(self.labels(c.axes)[1] for c in self.cells))}

    def labels(self, axes):
        return _labels(self.matrix, axes)

    def record_of(self, result):
        """A result as stored and reported: its record plus its table row and column."""
        rec = result.record()
        rec["row"], rec["column"] = self.labels(result.axes)
        return rec

    def dropped_records(self):
        return [{"id": d.id, "axes": d.axes, "rule": d.rule, "reason": d.reason,
                 **dict(zip(("row", "column"), self.labels(d.axes)))} for d in self.dropped]

    def env(self):
        """What known-failure conditions can name besides axes."""
        v = versions()
        return {"profile": self.matrix.profile, "target": self.target.name, "device": self.matrix.device,
                "tier": self.matrix.tier, "torch": v.get("torch"), "torchtitan": v.get("torchtitan")}


@functools.lru_cache(maxsize=None)
def versions():
    """The versions a report and a known-failure condition name (installed once per session)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("torch", "torchtitan"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class MatrixSession:
    """State of a matrix run; registered as a plugin when --simplefsdp-matrix is on."""

    def __init__(self, config, files=None):
        self.config = config
        self.dry_run = bool(option(config, "dry-run"))
        self.launcher = _launcher(config, self.dry_run)
        self.timeout = _number(config, "timeout", None)
        self.cache_dir = config.rootpath / ".simplefsdp"
        self.log_limit = int(_number(config, "log-limit") * 2**20)
        max_ranks = _number(config, "max-ranks", None)
        self.max_ranks = int(max_ranks) if max_ranks else max(1, int(psutil.virtual_memory().available / 1e9))
        jobs = str(option(config, "jobs") or "1")
        if jobs != "auto" and not (jobs.isdigit() and int(jobs) > 0):
            raise pytest.UsageError(f"--simplefsdp-jobs: expected a positive number or auto, got {jobs!r}")
        self.jobs = jobs
        self.packer = None
        self.lock = threading.RLock()  # seeds, baselines and the results file, when cells run in threads
        try:
            tier = option(config, "tier")
            if tier not in ("real", "trace"):
                raise pytest.UsageError(f"--simplefsdp-tier: unknown tier {tier!r}; known: real, trace")
            self.runs = [MatrixRun(p, config, self.cache_dir, tier) for p in (files or matrix_files(config))]
        except MatrixError as e:
            raise pytest.UsageError(str(e)) from None
        for run in self.runs:
            problem = run.target.check_installed()
            if problem and not self.dry_run:
                raise pytest.UsageError(problem)
            try:  # flags spelled the way the installed torchtitan takes them (a dry run elsewhere: unchecked)
                if not problem:
                    run.target.bind(run.cells)
            except (MatrixError, RuntimeError) as e:
                raise pytest.UsageError(str(e)) from None
        if not self.dry_run:
            for run in self.runs:
                if run.matrix.device == "cuda" and not self.launcher_for(run).remote:  # (trace tier: CPU)
                    need = max(c.world for c in run.cells) if run.cells else 0
                    have = _cuda_devices()
                    if have < need:
                        raise pytest.UsageError(
                            f"{run.matrix.path}: profile {run.matrix.profile} needs {need} CUDA devices, "
                            f"{have} visible; use --simplefsdp-dry-run to list its cells")
        self.mutants = {}  # run name -> [mutants.Mutant] of --simplefsdp-mutants
        if option(config, "mutants"):
            for run in self.runs:
                try:
                    self.mutants[run.name] = mutants.parse_names(option(config, "mutants"), run.target.MUTANTS)
                except ValueError as e:
                    raise pytest.UsageError(f"--simplefsdp-mutants: {run.name} (target {run.target.name}): {e}") \
                        from None
        self.gate = bool(option(config, "gate"))
        self.update_known = bool(option(config, "update-known-failures"))
        self.known = self._load_known_failures(config)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        art = option(config, "artifacts")
        self.run_dir = Path(art) if art else self.cache_dir / "runs" / stamp
        # pytest-xdist: the controller names the run folder; each worker runs its cells (and its own seeds
        # and baselines) in a subfolder, and its records reach the controller on the test reports
        self.worker = getattr(config, "workerinput", None)
        if self.worker is not None and "simplefsdp_run_dir" in self.worker:
            self.run_dir = Path(self.worker["simplefsdp_run_dir"]) / self.worker["workerid"]
        elif getattr(config.option, "numprocesses", None):
            if self.jobs != "1":
                raise pytest.UsageError("--simplefsdp-jobs packs cells in one process; with pytest-xdist (-n) "
                                        "choose one of the two")
            if self.dry_run:
                raise pytest.UsageError("--simplefsdp-dry-run lists the commands in one process: drop -n")
        self.results = {}  # (run name, cell id) -> CellResult of the cells this process ran
        self.pending = []  # records made since the last test report (they ride on the next one)
        self.records = []  # every record of the run, from the test reports: what the table and JSON show
        self.selected = []
        self.baselines = {}  # (run name, axes key) -> CellResult or an error line
        self.seeds = {}  # (run name, model) -> seed checkpoint folder or an error line
        self.stored_baselines = self._load_stored_baselines(option(config, "baseline"))
        self.jsonl = None

    def _load_known_failures(self, config):
        path = option(config, "known-failures")
        if not path:
            candidates = [config.rootpath / "known_failures.yaml", ROOT / "known_failures.yaml"]
            path = next((p for p in candidates if p.exists()), None)
            if path is None:
                return None
        elif not Path(path).exists():
            raise pytest.UsageError(f"--simplefsdp-known-failures: {path}: no such file")
        # every profile shipped or run counts: an entry must be able to match one of their cells
        shipped = []
        for p in sorted(MATRIX_DIR.glob("*.yaml")):  # in the real tier: a tier's rules may drop more
            run = next((r for r in self.runs if r.matrix.path.resolve() == p.resolve() and r.matrix.tier == "real"),
                       None)
            try:
                shipped.append(run or MatrixRun(p, config, self.cache_dir))
            except MatrixError:
                continue
        profiles = [r for r in self.runs if r not in shipped] + shipped
        axis_names = {a for r in profiles for a in r.matrix.axes}
        try:
            known = load_known_failures(path, axis_names, allow_todo_links=self.update_known)
            for entry in known.entries:
                if not any(could_apply(entry, c.axes, r.env()) for r in profiles for c in r.cells):
                    raise MatrixError(f"{entry.where}: entry {entry.id!r} matches no valid cell of any profile "
                                      f"({', '.join(r.matrix.profile for r in profiles)})")
        except MatrixError as e:
            raise pytest.UsageError(str(e)) from None
        return known

    def entries_for(self, run, cell):
        return self.known.for_cell(cell.axes, run.env()) if self.known else []

    # --- collection ---------------------------------------------------------------------

    def pytest_ignore_collect(self, collection_path, config):
        return True  # matrix mode runs the matrix only

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        for run in self.runs:
            collector = MatrixCollector.from_parent(session, name=run.name, nodeid=run.name, run=run)
            items.extend(session.genitems(collector))  # reports the collection like any file's

    def pytest_report_header(self, config):
        lines = []
        for run in self.runs:
            lines.append(f"simplefsdp: {run.name} profile={run.matrix.profile} target={run.target.name} "
                         f"cells={len(run.cells)} n/a={len(run.dropped)} flags={run.target.spelling} "
                         f"launcher={self.launcher.name}" + (" DRY RUN" if self.dry_run else ""))
        return lines

    # --- running ------------------------------------------------------------------------

    def cell_timeout(self, run):
        return self.timeout or run.matrix.timeout or DEFAULT_TIMEOUT

    def spec_for(self, run, cell, port=None, seed=None):
        cell_dir = self.run_dir / value_id(run.matrix.profile + ("" if run.matrix.tier == "real" else
                                                                  f"-{run.matrix.tier}")) / cell.id
        port = port or free_port()
        command = run.target.command(cell, dump_folder=cell_dir / "dump", nproc=cell.world, port=port,
                                     seed_folder=seed)
        command.env["SIMPLEFSDP_EVIDENCE_DIR"] = str(probe_folder(cell_dir))  # where ranks record what ran
        if cell.mutant:
            command.env["SIMPLEFSDP_MUTANT"] = cell.mutant
        # the trace tier: one process plays rank `trace.rank` of the cell's world
        nproc, first = (1, run.matrix.trace["rank"]) if run.matrix.tier == "trace" else (cell.world, 0)
        return LaunchSpec(cell.id, command, nproc, cell_dir, self.cell_timeout(run), port, self.log_limit,
                          first_rank=first, device=run.matrix.device if run.matrix.tier == "real" else "cpu")

    def launcher_for(self, run):
        """The trace tier runs one plain process (torchrun would reset RANK); otherwise the chosen one."""
        return LAUNCHERS["local"]() if run.matrix.tier == "trace" else self.launcher

    def _store(self, record):
        if self.jsonl is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(self.run_dir / "results.jsonl", "a")
            for run in self.runs:
                self._write(run.meta(self.launcher.name))
                for rec in run.dropped_records():
                    self._write({"type": "dropped", "matrix": run.name, **rec})
        self._write(record)

    def _write(self, record):
        with self.lock:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
            os.fsync(self.jsonl.fileno())

    def run_and_check(self, run, cell, devices=None):
        """Run a cell and, where the matrix asks for it, compare its losses with its baseline."""
        result = self.run_cell(run, cell, devices)
        if run.matrix.numerics:
            self.check_numerics(run, cell, result)
        return result

    def run_cell(self, run, cell, devices=None):
        with self.lock:
            if not run.prepared:
                run.target.prepare()
                run.prepared = True
        reused = None if cell.mutant else self.baselines.get((run.name, _key(cell.axes)))
        if reused is not None and not isinstance(reused, str):  # it already ran as a baseline
            return dataclasses.replace(reused, id=cell.id, details=[f"same cell as baseline {reused.id}"])
        seed = self.seed_for(run, cell)
        if isinstance(seed, str):
            return CellResult(cell.id, dict(cell.axes), status="failed", failure_class="infra", world=cell.world,
                              error_line=seed, error_text=seed)
        spec = self.spec_for(run, cell, seed=seed)
        if devices is not None:
            spec.command.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        launcher = self.launcher_for(run)
        _write_command(spec, launcher)
        if run.matrix.device == "cpu" and spec.nproc > self.max_ranks and not launcher.remote:
            outcome = LaunchOutcome(reproducer=launcher.reproducer(spec), launch_error=(
                f"{cell.world} ranks do not fit this machine: at most {self.max_ranks} "
                f"(--simplefsdp-max-ranks; default one per GB of available memory)"))
        else:
            outcome = launcher.launch(spec)
        result = build_result(cell, outcome, spec.log_dir, run.matrix.settings.get("steps"))
        if result.failure_class == "infra" and "is already in use" in (result.error_line or ""):
            # another process took the free port between our check and the bind: once more, elsewhere
            taken = result.error_line
            shutil.rmtree(spec.log_dir)
            spec.port = free_port()
            _write_command(spec, launcher)
            result = build_result(cell, launcher.launch(spec), spec.log_dir, run.matrix.settings.get("steps"))
            result.details.append(f"first try: {taken}; relaunched on port {spec.port}")
        if result.status == "passed":  # a green must show that its label took effect
            evidence = run.target.evidence(cell, spec.log_dir)
            result.evidence = [e.record() for e in evidence]
            contradicted = [e for e in evidence if not e.ok]
            if contradicted:
                line = f"the run does not show its label: {contradicted[0].line()}"
                result.status, result.failure_class, result.error_line, result.error_text = (
                    "failed", "invalid_config", line, line)
        if run.matrix.numerics and result.status == "passed":
            result.losses = run.target.losses(spec.log_dir / "dump") or result.losses
        trace = Path(spec.command.env.get("TORCH_TRACE", spec.log_dir / "torch_trace"))
        if result.failure_class and trace.is_dir():
            result.trace_html = render_trace(trace, spec.log_dir / "tlparse")
        return result

    # --- numerics -----------------------------------------------------------------------

    def seed_for(self, run, cell):
        """The seed checkpoint of the cell's model (made once per run), None, or an error line."""
        if not run.matrix.numerics or not run.target.seed_command or "model" not in cell.axes:
            return None
        key = (run.name, cell.axes["model"])
        with self.lock:
            return self._seed(run, cell, key)

    def _seed(self, run, cell, key):
        if key not in self.seeds:
            folder = self.run_dir / value_id(run.matrix.profile) / f"seed-{cell.axes['model']}"
            command = run.target.seed_command(cell.axes["model"], folder)
            spec = LaunchSpec(f"seed-{cell.axes['model']}", command, 1, folder, self.cell_timeout(run), free_port(),
                              self.log_limit)
            outcome = self.launcher.launch(spec)
            if (folder / "checkpoint" / "step-0").is_dir():
                self.seeds[key] = folder
            else:
                res = build_result(Cell(spec.cell_id, {}, 1), outcome, folder)
                self.seeds[key] = f"seed checkpoint for {cell.axes['model']} failed: {res.error_line} (logs: {folder})"
        return self.seeds[key]

    def _load_stored_baselines(self, path):
        if not path:
            return {}
        try:
            doc = report.load_run(path)
        except (OSError, SystemExit) as e:
            raise pytest.UsageError(f"--simplefsdp-baseline: {path}: {e}") from None
        stored = {}
        for run in doc.get("runs", []):
            for rec in run.get("baselines", []) + run.get("cells", []):
                if rec.get("status") in ("passed", "xpassed") or rec.get("failure_class") is None:
                    stored[(run["meta"].get("profile"), _key(rec["axes"]))] = rec
        return stored

    def baseline_for(self, run, cell, result):
        """The baseline CellResult of a cell, or an error line that says why there is none."""
        base_axes = run.target.baseline_axes(cell.axes)
        key = (run.name, _key(base_axes))
        if base_axes == cell.axes and not cell.mutant:  # a mutated run is compared with the cell unmutated
            self.baselines[key] = result
            return result
        stored = self.stored_baselines.get((run.matrix.profile, _key(base_axes)))
        if stored is not None:
            losses = {int(k): (math.nan if v is None else v) for k, v in stored["losses"].items()}
            want = run.matrix.settings.get("steps")
            if want and len(losses) != want:
                return f"stored baseline {stored['id']} has {len(losses)} steps, this run trains {want}"
            return CellResult(stored["id"], stored["axes"], losses=losses, log_dir=stored.get("log_dir", ""))
        with self.lock:
            return self._baseline(run, base_axes, key)

    def _baseline(self, run, base_axes, key):
        if key not in self.baselines:
            done = next((r for (name, _), r in self.results.items() if name == run.name and r.axes == base_axes
                         and r.failure_class is None and not r.mutant), None)
            if done is None:
                bid = "baseline-" + cell_id(run.matrix, base_axes)
                done = self.run_cell(run, Cell(bid, base_axes, world_size(run.matrix, base_axes)))
                done.details.append("numerics baseline")
                self.record(run, done, kind="baseline")
            self.baselines[key] = done if done.failure_class is None else \
                f"baseline {done.id} failed: [{done.failure_class}] {done.error_line} (logs: {done.log_dir})"
        return self.baselines[key]

    def check_numerics(self, run, cell, result):
        lane = lane_for(run.matrix.numerics.lanes, cell.axes)
        if lane is None or result.status != "passed":
            return
        base = self.baseline_for(run, cell, result)
        if isinstance(base, str):
            result.status, result.failure_class, result.error_line = "failed", "numerics", base
            result.error_text = base
            return
        ok, rep = compare(result.losses, base.losses, lane)
        rep["baseline"] = base.id
        result.numerics = rep
        line = None if ok else mismatch_line(rep, base.id)
        stats = read_param_stats(probe_folder(result.log_dir))
        if stats:  # the target's probe recorded per-parameter norms: the baseline's must be there too
            base_stats = read_param_stats(probe_folder(base.log_dir)) if base.log_dir else {}
            if not base_stats:
                rep["params"] = f"not compared: baseline {base.id} has no per-parameter records"
            else:
                params_ok, rep["params"] = compare_params(stats, base_stats, lane)
                first = rep["params"]["first_difference"]
                # the earlier of the two is the cause: a gradient off at step 1 moves the loss of step 2
                if not params_ok and (ok or first["step"] <= (rep["first_differing_step"] or math.inf)):
                    ok, line, rep["check"] = False, param_line(rep["params"], base.id), first["kind"]
        if not ok:
            rep.setdefault("check", "loss")
            result.status, result.failure_class, result.error_line, result.error_text = "failed", "numerics", line, line
            result.plot = plot(Path(result.log_dir) / "loss_vs_baseline.png", result.losses, base.losses,
                               f"{cell.id} vs {base.id}")

    def record(self, run, result, kind="cell"):
        if kind == "cell":
            self.results[(run.name, result.id)] = result
        rec = run.record_of(result)
        rec.update(type=kind, matrix=run.name)
        Path(result.log_dir).mkdir(parents=True, exist_ok=True)
        (Path(result.log_dir) / "result.json").write_text(json.dumps(rec, indent=1) + "\n")
        with self.lock:
            self.pending.append(rec)

    def take_pending(self):
        with self.lock:
            out, self.pending = self.pending, []
        return out

    def pytest_runtest_logreport(self, report):
        """Records arrive with the test reports, from this process or from an xdist worker alike."""
        if self.worker is None:
            for rec in getattr(report, "simplefsdp_records", None) or ():
                self.collect(rec)

    def collect(self, rec):
        self.records.append(rec)
        self._store(rec)
        self.config.hook.pytest_simplefsdp_cell_result(config=self.config, record=rec)

    def run_one(self, path, cell_id, mutant=None):
        """The fixture API: run one cell (or one mutant of it) and judge it as a matrix item would."""
        run = next(r for r in self.runs if r.matrix.path.resolve() == Path(path).resolve())
        cell = next((c for c in run.cells if c.id == cell_id), None)
        if cell is None:
            raise pytest.UsageError(f"simplefsdp_cell: {run.matrix.path} has no valid cell {cell_id!r}; its cells: "
                                    f"{', '.join(c.id for c in run.cells[:20])}{' ...' if len(run.cells) > 20 else ''}")
        skip = next((e for e in self.entries_for(run, cell) if e.kind == "skip"), None)
        if skip:
            pytest.skip(f"known failure {skip.id}: {skip.reason} ({skip.link})")
        if mutant:
            cell = dataclasses.replace(cell, id=f"{cell.id}[mutant-{mutant}]", mutant=mutant)
        result = self.run_and_check(run, cell)
        if not mutant:
            self.apply_verdict(result, self.entries_for(run, cell))
        else:
            result.killed_by = mutants.killed_by(result)
        self.record(run, result)
        for rec in self.take_pending():
            self.collect(rec)
        return result

    def apply_verdict(self, result, entries):
        """Judge a result against its known-failure entries and write the verdict into it (a matrix item and
        the fixture alike)."""
        verdict = judge(result, entries, self.gate)
        result.signature = signature(result.error_text or result.error_line)
        result.status, result.verdict, result.flaky = verdict.outcome, verdict.message, verdict.flaky
        if verdict.entry:
            result.known_failure, result.known_failure_link = verdict.entry.id, verdict.entry.link
        return verdict

    def close(self):
        if hasattr(self.launcher, "close"):
            self.launcher.close()
        kill_procs(session_leftovers())
        if self.jsonl is not None:
            self.jsonl.close()

    # --- reporting ----------------------------------------------------------------------

    def document(self):
        runs = []
        for run in self.runs:
            order = {c.id: i for i, c in enumerate(run.cells)}
            mine = [{k: v for k, v in r.items() if k not in ("type", "matrix")}
                    for r in self.records if r["matrix"] == run.name]
            kinds = [r["type"] for r in self.records if r["matrix"] == run.name]
            cells = sorted((r for r, k in zip(mine, kinds) if k == "cell" and not r.get("mutant")),
                           key=lambda r: order.get(r["id"], len(order)))
            baselines = [r for r, k in zip(mine, kinds) if k == "baseline"]
            mutated = [r for r, k in zip(mine, kinds) if k == "cell" and r.get("mutant")]
            meta = run.meta(self.launcher.name)
            meta.pop("type")
            runs.append({"meta": meta, "cells": cells, "dropped": run.dropped_records(), "baselines": baselines,
                         **({"mutants": mutated} if mutated else {})})
        return {"runs": runs}

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if self.worker is not None:
            return
        if self.dry_run:
            tr.section("simplefsdp dry run: commands")
            for run, cell in self.selected:
                spec = self.spec_for(run, cell, port=29500)
                tr.write_line(f"{run.name}::{cell.id}  [{cell.world} ranks, timeout {spec.timeout:.0f} s]")
                tr.write_line(f"  {self.launcher_for(run).reproducer(spec)}")
                plan = run.target.evidence_plan(cell)
                if plan:
                    tr.write_line(f"  evidence: {'; '.join(e.line() for e in plan)}")
            for run in self.runs:
                tr.write_line(f"{run.name}: {len(run.cells)} valid cells, {len(run.dropped)} n/a")
            return
        doc = self.document()
        previous = option(self.config, "compare")
        if previous:
            doc["comparison"] = report.compare_runs(report.load_run(previous), doc)
            tr.section(f"simplefsdp: changes since {previous}")
            for key, change in doc["comparison"].items():
                tr.write_line(f"{change}: {key}", red=change != "newly fixed", green=change == "newly fixed")
            if not doc["comparison"]:
                tr.write_line("no cell changed")
        if getattr(self, "leftover_lines", None):
            tr.section("simplefsdp: processes outlived the run (killed now)", red=True)
            for line in self.leftover_lines:
                tr.write_line(line, red=True)
        tr.section("simplefsdp composability")
        for line in getattr(self, "update_lines", []):
            tr.write_line(f"{self.update_path}: {line}")
        tr.write_line(report.render_text(doc))
        if self.jsonl is not None:
            tr.write_line(f"results: {self.run_dir / 'results.jsonl'}")
        status_md = option(self.config, "status-md")
        if status_md:
            Path(status_md).parent.mkdir(parents=True, exist_ok=True)
            Path(status_md).write_text(report.render_md(doc))
            tr.write_line(f"status table: {status_md}")
        path = option(self.config, "json")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(doc, indent=1) + "\n")
            tr.write_line(f"json report: {path}")
        self.config.hook.pytest_simplefsdp_report(config=self.config, doc=doc)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """pytest-xdist, on the controller: every worker writes under this run's folder."""
        node.workerinput["simplefsdp_run_dir"] = str(self.run_dir)

    def pytest_sessionfinish(self, session):
        for rec in self.take_pending():  # made before an interrupt, never reported: still stored
            if self.worker is None:
                self.collect(rec)
        if self.packer:
            self.packer.close()
        if hasattr(self.launcher, "close"):  # the fork servers end with the session
            self.launcher.close()
        leftovers = session_leftovers()  # the clean-up guarantee: nothing of this run may survive it
        if leftovers:
            self.leftover_lines = [f"pid {p.pid}: {' '.join(p.cmdline()[:6])}" for p in leftovers
                                   if p.is_running()]
            kill_procs(leftovers)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if not self.update_known or self.dry_run or self.worker is not None:
            return
        path = self.known.path if self.known else (option(self.config, "known-failures")
                                                   or self.config.rootpath / "known_failures.yaml")
        runs = {run.name: run for run in self.runs}
        cells = [(runs[r["matrix"]], CellResult.from_record(r)) for r in self.records
                 if r["type"] == "cell" and not r.get("mutant")]
        new = [(run.matrix.profile, r) for run, r in cells if r.status == "failed" and not r.known_failure
               and r.failure_class]
        outcomes = {}  # known-failure id -> [cell passed?] for the cells it applied to
        for run, r in cells:
            for e in self.entries_for(run, r):
                outcomes.setdefault(e.id, []).append(r.failure_class is None)
        passing = {eid for eid, passed in outcomes.items() if all(passed)
                   and any(e.id == eid and e.kind == "xfail" for e in (self.known.entries if self.known else []))}
        self.update_lines = update_file(path, new, passing, datetime.date.today().isoformat())
        self.update_path = path

    def pytest_collection_finish(self, session):
        cells = [item for item in session.items if isinstance(item, CellItem)]
        self.selected = [(item.run, item.cell) for item in cells]  # in collection order
        if self.jobs != "1" and not self.dry_run and cells:
            devices = _cuda_device_ids() if any(i.run.matrix.device == "cuda" for i in cells) else []
            budget = int(_number(self.config, "max-ranks", None) or os.cpu_count() or 1)
            if all(self.launcher_for(i.run).remote for i in cells):
                # a scheduler hands out nodes and GPUs; only the number of cells at once is ours
                devices, budget = [], math.inf
            jobs = len(cells) if self.jobs == "auto" else int(self.jobs)
            self.packer = Packer(jobs, budget, devices)
            for item in cells:
                if not any(e.kind == "skip" for e in self.entries_for(item.run, item.cell)):
                    self.packer.add(item.nodeid, item.cell.world,
                                    lambda devs, item=item: self.run_and_check(item.run, item.cell, devs))

    def pytest_unconfigure(self, config):
        if self.jsonl is not None:
            self.jsonl.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A known failure that passed, outside gate mode: the standard XPASS outcome."""
    rep = yield
    reason = getattr(item, "xpass_reason", None)
    if reason and call.when == "call" and rep.passed:
        rep.wasxfail = reason
    if call.when == "call" and isinstance(item, CellItem):  # plain data: pytest-xdist carries it to the controller
        rep.simplefsdp_records = item.session_state.take_pending()
    return rep


class MatrixCollector(pytest.Collector):
    def __init__(self, *, run, **kwargs):
        super().__init__(**kwargs)
        self.run = run

    def collect(self):
        for cell in self._cells():
            item = CellItem.from_parent(self, name=cell.id, run=self.run, cell=cell)
            item.add_marker(pytest.mark.simplefsdp)
            if cell.smoke:
                item.add_marker(pytest.mark.smoke)
            for group, entries in self.run.matrix.groups.items():
                if any(all(cell.axes.get(k) == v for k, v in e.values.items()) for e in entries):
                    item.extra_keyword_matches.add(group)
            yield item

    def _cells(self):
        """The matrix's cells; under --simplefsdp-mutants, each cell once per mutant that applies to it
        (cells with a known failure are left out: a gate cannot be tested where the cell already fails)."""
        state = self.config.pluginmanager.get_plugin("simplefsdp-session")
        chosen = state.mutants.get(self.run.name)
        if not chosen:
            yield from self.run.cells
            return
        for cell in self.run.cells:
            if not state.entries_for(self.run, cell):
                for m in chosen:
                    if m.applies(cell.axes):
                        yield dataclasses.replace(cell, id=f"{cell.id}[mutant-{m.name}]", mutant=m.name)


class CellFailed(Exception):
    def __init__(self, result):
        super().__init__(result.error_line)
        self.result = result


class MutantNotKilled(Exception):
    def __init__(self, result):
        super().__init__(result.verdict)
        self.result = result


class CellItem(pytest.Item):
    def __init__(self, *, run, cell: Cell, **kwargs):
        super().__init__(**kwargs)
        self.run, self.cell = run, cell
        self.user_properties.append(("axes", json.dumps(cell.axes)))
        self.user_properties.extend((f"axis.{k}", v) for k, v in cell.axes.items())  # dashboards slice by axis

    @property
    def session_state(self) -> MatrixSession:
        return self.config.pluginmanager.get_plugin("simplefsdp-session")

    def runtest(self):
        state = self.session_state
        if state.dry_run:
            pytest.skip("dry run: not launched")
        entries = state.entries_for(self.run, self.cell)
        skip = next((e for e in entries if e.kind == "skip"), None)
        if skip:
            result = CellResult(self.cell.id, dict(self.cell.axes), status="skipped", world=self.cell.world,
                                known_failure=skip.id, known_failure_link=skip.link, verdict=skip.reason)
            state.record(self.run, result)
            self.user_properties.append(("known_failure", skip.id))
            pytest.skip(f"known failure {skip.id}: {skip.reason} ({skip.link})")
        start = time.monotonic()
        if state.packer:
            result = state.packer.result(self.nodeid)
        else:
            result = state.run_and_check(self.run, self.cell)
        if self.cell.mutant:
            return self._judge_mutant(state, result)
        verdict = state.apply_verdict(result, entries)
        if verdict.entry:
            self.user_properties.append(("known_failure", verdict.entry.id))
        state.record(self.run, result)
        self.user_properties.append(("wall_s", round(time.monotonic() - start, 2)))
        if result.failure_class:
            self.user_properties.append(("failure_class", result.failure_class))
        if verdict.outcome == "xfailed":
            pytest.xfail(verdict.message)
        if verdict.outcome == "xpassed":
            self.xpass_reason = verdict.message
        if verdict.outcome == "failed":
            raise CellFailed(result)

    def _judge_mutant(self, state, result):
        """Killed (the item passes) when a check failed the mutated run after the mutant acted; survived
        (fails) when the run was green; inconclusive (fails) when the mutant changed nothing."""
        result.killed_by = mutants.killed_by(result)
        acted = mutants.applied(result.log_dir, self.cell.mutant)
        bug = next(m.bug for m in state.mutants[self.run.name] if m.name == self.cell.mutant)
        caught = f"[{result.failure_class}] {result.error_line}" if result.failure_class else ""
        if not acted:
            result.mutation = "inconclusive"
            result.verdict = (f"mutant {self.cell.mutant} did not act in this run (nothing of its kind to change"
                              f"{', or the run failed first: ' + caught if caught else ''})")
        elif result.killed_by:
            result.mutation = "killed"
            result.verdict = f"mutant {self.cell.mutant} killed by the {result.killed_by} check: {caught}"
        else:
            result.mutation = "survived"
            result.verdict = f"mutant {self.cell.mutant} survived: the run with this bug was green ({bug})"
        result.status = "passed" if result.mutation == "killed" else "failed"
        state.record(self.run, result)
        self.user_properties.append(("killed_by", result.killed_by or ""))
        if result.status == "failed":
            raise MutantNotKilled(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MutantNotKilled):
            r = excinfo.value.result
            return f"{r.id}: {r.verdict}\n  logs: {r.log_dir}\n  rerun: {r.reproducer}"
        if isinstance(excinfo.value, CellFailed):
            r = excinfo.value.result
            if not r.failure_class:  # a pass that a gate turns into a failure
                return f"{r.id}: [XPASS(strict)] {r.verdict}"
            lines = [f"{r.id}: [{r.failure_class}] {r.error_line}"]
            if r.verdict:
                lines.append(f"  {r.verdict}")
            if r.failing_rank is not None:
                lines.append(f"  first failing rank: {r.failing_rank} (exit codes {r.exit_codes})")
            if r.error_text and r.error_text != r.error_line:
                lines.append("  " + r.error_text.replace("\n", "\n  ")[:4000])
            lines.extend(f"  {d}" for d in r.details)
            lines.append(f"  logs: {r.log_dir}")
            lines.append(f"  rerun: {r.reproducer}")
            return "\n".join(lines)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        line = self.cell.where.rpartition(":")[2]
        return self.run.matrix.path, int(line) - 1 if line.isdigit() else None, self.cell.id


# --- the fixture API: one cell inside an ordinary test ------------------------------------------


@pytest.fixture
def simplefsdp_cell(request):
    """Runs the cell that the test's ``simplefsdp_cell`` marker names, as the matrix runs it (same
    launcher, timeout, clean-up, artifacts, evidence, numerics and known failures, from the
    --simplefsdp-* options), and returns its judged CellResult (status, failure_class, error_line,
    losses, grad_norms, evidence, numerics, log_dir)::

        @pytest.mark.simplefsdp_cell("deepseek_v3-dp2-ep2-eager", profile="cpu")
        def test_ep_trains(simplefsdp_cell):
            assert simplefsdp_cell.status == "passed"
    """
    marker = request.node.get_closest_marker("simplefsdp_cell")
    if marker is None or len(marker.args) != 1:
        raise pytest.UsageError(f"{request.node.nodeid}: the simplefsdp_cell fixture needs "
                                f"@pytest.mark.simplefsdp_cell(cell_id, matrix=PATH or profile=NAME)")
    matrix, profile = marker.kwargs.get("matrix"), marker.kwargs.get("profile")
    if (matrix is None) == (profile is None):
        raise pytest.UsageError(f"{request.node.nodeid}: simplefsdp_cell: give matrix=PATH or profile=NAME")
    path = Path(matrix) if matrix else MATRIX_DIR / f"{profile}.yaml"
    path = path if path.is_absolute() else request.path.parent / path
    return _fixture_session(request.config, path).run_one(path, marker.args[0], marker.kwargs.get("mutant"))


def _fixture_session(config, path: Path) -> "MatrixSession":
    """One MatrixSession per matrix file for the whole pytest session, closed at its end."""
    sessions = config.stash.setdefault(_FIXTURE_SESSIONS, {})
    if path not in sessions:
        if not config.pluginmanager.has_plugin("simplefsdp-builtins"):
            config.pluginmanager.register(Builtins(), "simplefsdp-builtins")
            become_subreaper()
        if not path.exists():
            raise pytest.UsageError(f"simplefsdp_cell: {path}: no such matrix file")
        try:
            sessions[path] = MatrixSession(config, files=[path])
        except MatrixError as e:
            raise pytest.UsageError(str(e)) from None
        config.add_cleanup(sessions[path].close)
    return sessions[path]


_FIXTURE_SESSIONS = pytest.StashKey[dict]()
