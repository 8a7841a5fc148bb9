"""Steps 1-2 for a session: which matrix files run (profiles), and each one loaded with its target and
expanded into cells (a MatrixRun), plus what the machine offers them (visible GPUs)."""

from __future__ import annotations

import datetime
import functools
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from .cells import expand, id_parts
from .matrix import load_matrix, with_tier
from .targets import ROOT

MATRIX_DIR = ROOT / "matrix"
COLUMN_AXES = ("compile", "backend", "memory_policy")


def installed(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=None)
def versions():
    """The versions a report and a known-failure condition name (read once per session)."""
    out = {"python": platform.python_version()}
    out.update({pkg: installed(pkg) for pkg in ("torch", "torchtitan") if installed(pkg)})
    return out


@functools.lru_cache(maxsize=None)
def machine():
    """Where a run ran, for its meta record: the host, its GPUs (nvidia-smi's names) and the git revisions
    torch and torchtitan were built from (read from their files: nothing is imported)."""
    gpus = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout
            gpus = [line.strip() for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"host": platform.node(), "gpus": gpus, "revisions": {k: v for k, v in (
        ("torch", _torch_git_version()), ("torchtitan", _vcs_commit("torchtitan"))) if v}}


def _torch_git_version():
    spec = importlib.util.find_spec("torch")
    try:
        text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    except OSError:
        return None
    m = re.search(r"^git_version\s*=\s*['\"]([0-9a-f]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _vcs_commit(package):
    """The commit a package was installed from (pip's direct_url.json for a git or local checkout), else None."""
    try:
        text = metadata.distribution(package).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        return (json.loads(text).get("vcs_info") or {}).get("commit_id") if text else None
    except json.JSONDecodeError:
        return None


def cuda_device_ids():
    """The GPUs cells may use: CUDA_VISIBLE_DEVICES where it is set, else every GPU nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i in range(sum(1 for line in out.splitlines() if line.startswith("GPU ")))]


def shipped():
    """name -> path of the profiles shipped in matrix/."""
    return {p.stem: p for p in sorted(MATRIX_DIR.glob("*.yaml"))}


def matrix_files(settings) -> list[Path]:
    """The matrix files of --simplefsdp-matrix-file, else of --simplefsdp-profile."""
    if settings.matrix_file:
        return list(settings.matrix_file)
    known = shipped()
    out = []
    for name in [p.strip() for p in str(settings.profile).split(",") if p.strip()]:
        if name == "all":  # the upstream-sourced ones read their generation's installed tests: by name only
            out.extend(p for n, p in known.items() if not n.endswith("upstream"))
        elif name == "auto":  # the installed generation's profile for this machine
            prefix = "titan02-" if installed("torchtitan").startswith("0.2.") else ""
            out.append(known[prefix + ("h100x8" if len(cuda_device_ids()) >= 8 else "cpu")])
        elif name in known:
            out.append(known[name])
        else:
            raise pytest.UsageError(f"--simplefsdp-profile: unknown profile {name!r}; "
                                    f"known: auto, all, {', '.join(known)}")
    return out


class MatrixRun:
    """One matrix file of the session: its matrix (in the session's tier), target, cells and n/a cells."""

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
                "target": self.target.name, "device": str(self.matrix.device), "launcher": launcher,
                "versions": versions(), **machine(), "date": datetime.date.today().isoformat(),
                "cells": len(self.cells), "dropped_cells": len(self.dropped), "tier": str(self.matrix.tier),
                "columns": list(dict.fromkeys(self.labels(c.axes)[1] for c in self.cells)),
                "valid": [dict(zip(("model", "row", "column"), (c.axes.get("model", ""), *self.labels(c.axes))))
                          for c in self.cells]}

    def labels(self, axes):
        """(row, column) labels for the table: columns are compile x backend x memory policy (an upstream test
        is a row of its own)."""
        if self.matrix.upstream:
            return axes["upstream"], " ".join(str(axes[a]) for a in ("compile", "backend") if a in axes)
        col_axes = [a for a in self.matrix.axes if a in COLUMN_AXES] or [list(self.matrix.axes)[-1]]
        parts = id_parts(self.matrix, axes)
        row = " ".join(parts[a] for a in self.matrix.axes if a not in col_axes and parts[a]) or "-"
        col = " ".join(parts[a] for a in col_axes if parts[a]) or "-"
        return row, col

    def key(self, cell_id):
        """The cell's key across runs and machines (report.key): profile, tier, cell id."""
        from .report import key

        return key({"profile": self.matrix.profile, "tier": str(self.matrix.tier)}, {"id": cell_id})

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

    def cell(self, cell_id):
        return next((c for c in self.cells if c.id == cell_id), None)
