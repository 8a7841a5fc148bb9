"""Step 4's proof of versions: what every rank imported (shim/provenance.py records it), checked against what the
cell was asked to run on. A run on a named version set (a PR's base, a twin's other side, a bisection's probe)
whose ranks imported a package from anywhere but that set's environment, or another version or commit than the
set pins, ran other code than its label says: infra naming both, never a verdict on the set. The installed side
runs what the environment pytest runs in imports; where that is not the installed distribution (a copy first on
the path), the cell says so."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..paths import probe_folder
from ..words import release


@dataclass(frozen=True)
class Expected:
    """What a cell's ranks must have imported: ``folder``, the version set's environment every proved package must
    come from, with its ``pins`` (package -> version, or ``@commit``); None for the installed side, whose
    ``installed`` (package -> the installed distribution's folder) is only compared, never enforced."""

    label: str
    folder: str | None = None
    pins: dict = field(default_factory=dict)
    installed: dict = field(default_factory=dict)


def read(log_dir) -> dict:
    """section -> rank -> that section of the rank's record, in one pass over the records: ``imported``
    ({package: identity}), ``machine`` (what decides a CPU rank's bits); ranks that recorded nothing are absent."""
    out: dict = {}
    for path in sorted(probe_folder(log_dir).glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for section in ("imported", "machine"):
            if record.get(section):
                out.setdefault(section, {})[int(path.stem[4:])] = record[section]
    return out


def agreed(seen: dict, nothing=None):
    """One value where every rank that recorded it agrees (rank -> value), else {"ranks": {rank: value}}, which
    matches no identity or machine; ``nothing`` where none recorded it."""
    distinct = {json.dumps(v, sort_keys=True) for v in seen.values()}
    if len(distinct) <= 1:
        return next(iter(seen.values()), nothing)
    return {"ranks": {str(r): v for r, v in seen.items()}}


def summary(records: dict) -> dict:
    """package -> what the ranks imported (``records``: rank -> {package: identity}), agreed over the ranks."""
    names = sorted({n for rec in records.values() for n, v in rec.items() if isinstance(v, dict)})
    return {
        name: agreed({r: rec[name] for r, rec in records.items() if isinstance(rec.get(name), dict)}) for name in names
    }


def _inside(path, folder) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _pinned(identity: dict, pin: str) -> bool:
    if pin.startswith("@"):
        commit = identity.get("commit") or ""
        return bool(commit) and (commit.startswith(pin[1:]) or pin[1:].startswith(commit))
    return release(identity.get("version")) == pin


def _said(name, identity) -> str:
    commit = identity.get("commit")
    return (
        f"{name} {identity.get('version') or '(no version)'}"
        + (f" @{commit[:12]}{' with local changes' if identity.get('dirty') else ''}" if commit else "")
        + f" from {identity.get('file')}"
    )


def mismatch(records: dict, expected: Expected) -> str | None:
    """Why a version set's ranks did not run that set (the first rank and package that tell), else None."""
    if expected.folder is None:
        return None
    for rank, rec in sorted(records.items()):
        for name, identity in sorted(rec.items()):
            if not isinstance(identity, dict):
                continue
            pin = expected.pins.get(name)
            if not _inside(identity.get("file", ""), expected.folder):
                wanted = f"its environment {expected.folder}"
            elif pin and not _pinned(identity, pin):
                wanted = f"{name}{pin if pin.startswith('@') else '==' + pin}"
            else:
                continue
            return (
                f"the ranks did not run version set {expected.label}: rank {rank} imported {_said(name, identity)}, "
                f"not {wanted}"
            )
    return None


def differences(records: dict, expected: Expected) -> list[str]:
    """The installed side: each package the ranks imported from somewhere else than the installed distribution."""
    out = []
    for name, identity in summary(records).items():
        where = expected.installed.get(name)
        files = (
            [identity.get("file", "")]
            if "ranks" not in identity
            else [v.get("file", "") for v in identity["ranks"].values()]
        )
        if where and any(f and not _inside(f, where) for f in files):
            out.append(
                f"the ranks imported {name} from {', '.join(sorted(set(files)))}, not the installed "
                f"distribution at {where}"
            )
    return out
