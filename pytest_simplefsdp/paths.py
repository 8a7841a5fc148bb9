"""Where the plugin's own files are: the shipped profiles, known failures, start-up shim, config modules and
asset generators. A wheel carries them inside the package (``pytest_simplefsdp/_data``, mapped there from the
repository's top-level ``matrix/``, ``fixtures/`` and ``known_failures.yaml`` by the build: one copy in the
repository); a source checkout (an editable install) reads them where they are. Nothing is ever written here:
outputs go under the rootdir a run starts in."""

from __future__ import annotations

import json
import os
from importlib.resources import files
from pathlib import Path

PACKAGE = Path(str(files(__package__)))
_PACKAGED = PACKAGE / "_data"
DATA = _PACKAGED if _PACKAGED.is_dir() else PACKAGE.parent  # (a source checkout: the repository's root)

MATRIX_DIR = DATA / "matrix"  # the shipped profiles
KNOWN_FAILURES = DATA / "known_failures.yaml"  # the shipped known failures
FIXTURES = DATA / "fixtures"  # config modules (titan03_configs), the 0.2 job TOML, the asset generator
SHIM_DIR = FIXTURES / "cpu_shim"  # sitecustomize.py: first on every rank's PYTHONPATH


def probe_folder(log_dir) -> Path:
    """Where a cell's ranks write their probe records ($SIMPLEFSDP_EVIDENCE_DIR): evidence, per-parameter norms,
    invariants, the running-rank markers."""
    return Path(log_dir) / "evidence"


def cache_root() -> Path:
    """The per-user cache (option tables, the known-failures check): every entry is keyed by what it depends on,
    so every run and rootdir may share it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pytest-simplefsdp"


def output_root(folder: Path) -> Path:
    """The run's own folder under the rootdir (``.simplefsdp``: runs, kept seeds and baselines, environments), made
    with a ``.gitignore`` that ignores it whole, as pytest's ``.pytest_cache`` does: a torchtitan checkout's
    ``git status`` stays clean and ``git add -A`` takes none of its gigabytes."""
    folder = Path(folder)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        folder.mkdir(parents=True, exist_ok=True)
        ignore.write_text("# Created by pytest-simplefsdp automatically.\n*\n")
    return folder


def shown(path, root) -> str:
    """A path as a report shows it: relative to ``root`` (the rootdir) where it lies under it, as pytest shows test
    files; else as it is."""
    if not path:
        return ""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)


def write_json(path: Path, doc) -> str:
    """``doc`` written to ``path`` as JSON, whole or not at all (through a file of this process, then a rename):
    sessions and workers writing the same cache entry never leave, or read, half a file. Returns the text."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)
    return text
