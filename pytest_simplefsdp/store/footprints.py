"""Footprints kept per torchtitan commit (--simplefsdp-footprint, on under the sentinel): one file per cell,
``.simplefsdp/footprints/<commit>/<matrix>/<cell>.json``, written by whichever process ran the cell (so a run under
``-n`` keeps them as one without), with the versions it ran and when. ``--simplefsdp-changed`` reads those of the
commit its diff starts from, or of the nearest kept commit before it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..paths import write_json
from ..spec.footprint import Footprint
from ..versions.git import is_ancestor

FOLDER = "footprints"


def save(root: Path, commit: str, matrix: str, cell: str, footprint: Footprint, versions: dict) -> Path:
    path = Path(root) / FOLDER / commit / matrix / f"{cell}.json"
    doc = {"commit": commit, "versions": versions, "made": time.strftime("%Y-%m-%dT%H:%M:%S"), **footprint.to_json()}
    write_json(path, doc)  # a reader never sees half a footprint
    return path


def load(root: Path, commit: str, matrix: str) -> dict:
    """{cell id: Footprint} kept for ``commit`` (a full hash) and a matrix."""
    out = {}
    for path in sorted((Path(root) / FOLDER / commit / matrix).glob("*.json")):
        try:
            out[path.stem] = Footprint.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def nearest(root: Path, repo, commit: str, matrix: str) -> str | None:
    """The kept commit with footprints of ``matrix`` that is ``commit`` or its newest ancestor (None: none)."""
    kept = [p.name for p in (Path(root) / FOLDER).glob("*") if (p / matrix).is_dir() and any((p / matrix).iterdir())]
    if commit in kept:
        return commit
    before = [k for k in kept if is_ancestor(repo, k, commit)]
    # the newest: the one every other is an ancestor of
    return next((k for k in before if all(is_ancestor(repo, o, k) for o in before)), None)
