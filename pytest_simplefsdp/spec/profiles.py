"""Steps 1-2 for a session: which matrix files run (profiles), and each one loaded with its target and
expanded into cells (a MatrixRun).

A profile is a matrix file found by name: the project's own ``matrix/<name>.yaml`` under the rootdir first, then
the one shipped with the plugin. Shipped profiles are named ``matrix/<name>.yaml`` in node ids from any rootdir,
so a FAILED line pasted back runs the same cell wherever the run started."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from ..kinds import RecordType, Tier
from ..machine import cuda_device_ids, installed, installed_commit, machine, torchtitan_trainers, versions
from ..paths import MATRIX_DIR
from ..versions.git import Commit
from ..versions.sets import INSTALLED, parse
from ..words import did_you_mean
from .cells import Dropped, cell_key, expand, id_parts
from .matrix import load_matrix, with_tier, with_versions
from .upstream import with_source

COLUMN_AXES = ("compile", "backend", "memory_policy")


def profile_dirs(rootdir) -> list[Path]:
    """Where profiles are looked up, in order: the project's own matrix/ folder, then the shipped one."""
    own = Path(rootdir) / "matrix"
    return [own, MATRIX_DIR] if own.resolve() != MATRIX_DIR.resolve() else [MATRIX_DIR]


def shipped(rootdir=None):
    """name -> path of every profile: the shipped ones, replaced by the project's own of the same name."""
    out = {}
    for folder in reversed(profile_dirs(rootdir) if rootdir else [MATRIX_DIR]):
        out.update({p.stem: p for p in sorted(folder.glob("*.yaml"))})
    return dict(sorted(out.items()))


def matrix_files(settings, rootdir) -> list[Path]:
    """The matrix files of --simplefsdp-matrix-file, else of --simplefsdp-profile."""
    if settings.matrix_file:
        return list(settings.matrix_file)
    known = shipped(rootdir)
    out = []
    for name in [p.strip() for p in str(settings.profile).split(",") if p.strip()]:
        if name == "all":  # the upstream-sourced ones read their generation's installed tests: by name only
            out.extend(p for n, p in known.items() if not n.endswith("upstream"))
        elif name == "auto":  # the installed generation's profile for this machine
            # by what the installed torchtitan ships, not its version (torchtitan main says 0.2.2)
            prefix = "" if "graph_trainer" in torchtitan_trainers() or not installed("torchtitan") else "titan02-"
            out.append(known[prefix + ("h100x8" if len(cuda_device_ids()) >= 8 else "cpu")])
        elif name in known:
            out.append(known[name])
        else:
            raise pytest.UsageError(
                f"--simplefsdp-profile: unknown profile {name!r}; known: auto, all, "
                f"{', '.join(known)}{did_you_mean(name, ['auto', 'all', *known])}"
            )
    return out


def shipped_path(arg: str) -> Path | None:
    """``matrix/<name>.yaml`` (as a node id names a shipped profile) -> the shipped file, where there is one."""
    folder, _, name = arg.replace(os.sep, "/").rpartition("/")
    path = MATRIX_DIR / name
    return path if folder in ("", "matrix") and path.suffix in (".yaml", ".yml") and path.is_file() else None


def run_name(path: Path, rootdir) -> str:
    """How a matrix file is named in node ids: its path relative to the rootdir; a shipped profile outside it as
    ``matrix/<file>``; any other file outside it by its name."""
    path = Path(path).resolve()
    rel = Path(os.path.relpath(path, Path(rootdir).resolve()))
    if not str(rel).startswith(".."):
        return rel.as_posix()
    return f"matrix/{path.name}" if path.parent == MATRIX_DIR.resolve() else path.name


class MatrixRun:
    """One matrix file of the session: its matrix (in the session's tier), target, cells and n/a cells."""

    def __init__(self, path, config, cache_dir, tier="real", versions=()):
        gpus = len(cuda_device_ids()) if tier == "trace" else 0  # a GPU profile's simulated rank runs on one
        self.matrix = with_versions(with_tier(with_source(load_matrix(path)), tier, gpus), versions)
        self.target = config.hook.pytest_simplefsdp_make_target(matrix=self.matrix, cache_dir=cache_dir)
        self.cells, self.dropped = expand(self.matrix)
        config.hook.pytest_simplefsdp_modify_cells(
            config=config, matrix=self.matrix, cells=self.cells, dropped=self.dropped
        )
        self.name = run_name(self.matrix.path, config.rootpath)
        if tier != "real":
            self.name += f"[{tier}]"
        self.prepared = False
        self.torchtitan_repo = None  # the checkout that orders torchtitan commits (the session's; see commit_of)

    def processes(self, cell) -> int:
        """How many processes (and GPUs, on a GPU) the cell's launch takes: its world, or one simulated rank."""
        return 1 if self.matrix.tier == Tier.TRACE else cell.world

    NOT_OFFERED = "not-offered"  # the rule name of the cells the installed torchtitan does not offer (target.bind)

    def bind(self):
        """Bind the cells to what is installed (target.bind); a cell whose value the installed torchtitan does not
        offer joins the n/a cells, with the target's reason."""
        offered = self.target.bind(self.cells) or {}
        self.dropped += [
            Dropped(c.id, c.axes, c.world, self.NOT_OFFERED, offered[c.id]) for c in self.cells if c.id in offered
        ]
        self.cells = [c for c in self.cells if c.id not in offered]

    def meta(self, launcher):
        return {
            "type": str(RecordType.META),
            "matrix": self.name,
            "profile": self.matrix.profile,
            "target": self.target.name,
            "device": str(self.matrix.device),
            "launcher": launcher,
            "versions": versions(),
            **machine(),
            "date": datetime.date.today().isoformat(),
            **({"torchtitan_commit": c.about()} if (c := self.commit_of()) else {}),
            "cells": len(self.cells),
            "dropped_cells": len(self.dropped),
            "tier": str(self.matrix.tier),
            "columns": list(dict.fromkeys(self.labels(c.axes)[1] for c in self.cells)),
            "valid": [
                {
                    "model": c.axes.get("model", ""),
                    **dict(zip(("row", "column"), self.labels(c.axes))),
                    "id": c.id,
                    "axes": c.axes,
                }
                for c in self.cells
            ],
        }

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
        """The cell's key across runs and machines (cells.cell_key)."""
        return cell_key(self.matrix.profile, self.matrix.tier, cell_id)

    def record_of(self, result):
        """A result as stored and reported: its record plus its table row and column."""
        rec = result.record()
        rec["row"], rec["column"] = self.labels(result.axes)
        return rec

    def dropped_records(self):
        return [
            {
                "id": d.id,
                "axes": d.axes,
                "rule": d.rule,
                "reason": d.reason,
                **dict(zip(("row", "column"), self.labels(d.axes))),
            }
            for d in self.dropped
        ]

    def env(self, axes=None):
        """What known-failure conditions can name besides axes; the versions are the cell's (``axes``: its version
        set), else those pytest runs with."""
        v = parse((axes or {}).get("versions", INSTALLED)).versions(versions())
        return {
            "profile": self.matrix.profile,
            "target": self.target.name,
            "device": self.matrix.device,
            "tier": self.matrix.tier,
            "torch": v.get("torch"),
            "torchtitan": v.get("torchtitan"),
            "torchtitan_commit": self.commit_of(axes),
        }

    def commit_of(self, axes=None) -> Commit | None:
        """The torchtitan commit a cell runs (its version set's ``torchtitan@<commit>``, else the installed one's), with
        the checkout that orders it; None where torchtitan is a release."""
        pinned = parse((axes or {}).get("versions", INSTALLED)).get("torchtitan")
        if pinned is not None:
            return Commit(pinned[1:], self.torchtitan_repo) if pinned.startswith("@") else None
        found = installed_commit()
        return Commit(found[0], found[1] or self.torchtitan_repo) if found else None

    def cell(self, cell_id):
        return next((c for c in self.cells if c.id == cell_id), None)
