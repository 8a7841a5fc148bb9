"""Seed checkpoints and numerics baselines kept across runs (the numerics step's store, used by baselines.Book).

A job's content key is a hash over everything its result depends on: the torch and torchtitan versions and
git revisions, the installed torchtitan's code (a checkout's edits), what picks the host's CPU kernels, the job's
command (arguments and environment, with the run's own folders, the rootdir's ``.simplefsdp`` and the reuse folder
written as placeholders), and the bytes of every file the command names (the shim and config modules on its
PYTHONPATH, the tokenizer and dataset, a config TOML). Each kept job is a folder named by its key under
``.simplefsdp/reuse/`` (beside ``.simplefsdp/runs/``; ``--simplefsdp-reuse-dir`` names another, which several
rootdirs may share): a later run with the same key uses it instead of running the job again; ``--simplefsdp-fresh``
runs every job again and keeps the new result."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import uuid
from pathlib import Path

import psutil

from ..machine import code_identity, machine, versions
from ..shim.provenance import NUMERICS_ENV, cpu_flags

DONE = "reuse.json"  # written last: a folder without it is a job that did not finish (never used)
HASH_LIMIT = 256 * 2**20  # a named file bigger than this enters the key by size and mtime, not by its bytes


def _hash_path(h, path: Path, roots: dict):
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    )
    for f in files:
        if any(root in f.parents for root in roots.values()):
            continue
        h.update(str(f).encode() + b"\0")
        st = f.stat()
        if st.st_size > HASH_LIMIT:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(f.read_bytes())


def _placed(text: str, roots: dict) -> str:
    """``text`` with each root folder written as its placeholder (the deepest first: the reuse folder may lie in the
    cache folder), so a key names no folder of the run or the rootdir."""
    for name, root in sorted(roots.items(), key=lambda kv: -len(str(kv[1]))):
        text = text.replace(str(root), name)
    return text


def content_key(command, roots: dict) -> str:
    """The key of a job run by ``command`` (a targets.RankCommand built with placeholder folders). ``roots``:
    placeholder -> folder (the plugin's cache folder, the reuse folder): what lies there is named by its own key (a
    kept seed) or made by what the command names (the generated assets), so it is neither hashed nor named by where
    it lies: two rootdirs, or two checkouts sharing --simplefsdp-reuse-dir, give one job one key."""
    roots = {name: Path(root) for name, root in roots.items()}
    h = hashlib.sha256()
    # the installed torchtitan's own code where the job runs it (a version set's environment is fixed by its pins):
    # an edited checkout keeps its version and install commit, and a baseline of the code before the edit is stale
    code = None if command.env.get("SIMPLEFSDP_VERSIONS") else code_identity()
    # and what picks the CPU kernels where the command leaves it to the host (its environment, its CPU's vector flags):
    # a baseline kept on another CPU, or under another oneDNN cap, has other bits
    host = {"env": {k: os.environ.get(k) for k in NUMERICS_ENV if k not in command.env}, "flags": cpu_flags()}
    job = {
        "argv": command.argv[1:],
        "env": command.env,
        "cwd": command.cwd,
        "code": code,
        "host": host,
        "versions": versions(),
        "revisions": machine()["revisions"],
    }
    h.update(_placed(json.dumps(job, sort_keys=True), roots).encode())
    named = set()
    for token in [*command.argv[1:], *command.env.values()]:
        for part in str(token).split(os.pathsep):
            part = part.split("=", 1)[-1]
            if os.path.isabs(part) and os.path.exists(part) and Path(part) != Path(command.argv[0]):
                named.add(Path(part))
    for path in sorted(named):
        if not any(root == path or root in path.parents for root in roots.values()):
            _hash_path(h, path, roots)
    return h.hexdigest()[:16]


class ReuseStore:
    def __init__(self, root: Path, fresh: bool):
        self.root, self.fresh = Path(root), fresh
        self.sweep()

    def sweep(self):
        """Drop the unfinished folders of processes of this host that are gone: a session killed while it
        made a seed leaves its scratch folder behind. A live process's folder, or another host's (the root
        may be on a shared file system), is never touched."""
        for path in self.root.glob(".*~*~*~*") if self.root.is_dir() else ():
            _, host, pid, _ = path.name.rsplit("~", 3)
            if host == platform.node() and pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _unfinished(name) -> str:
        """``.<name>~<host>~<pid>~<hex>``: whose it is, for the sweep."""
        return f".{name}~{platform.node()}~{os.getpid()}~{uuid.uuid4().hex[:8]}"

    def folder(self, name, key) -> Path:
        return self.root / f"{name}-{key}"

    def kept(self, name, key) -> Path | None:
        """The kept folder of the job, unless the run is fresh or the job never finished."""
        folder = self.folder(name, key)
        return folder if not self.fresh and (folder / DONE).is_file() else None

    @staticmethod
    def about(folder: Path) -> dict:
        """What ``keep`` wrote about a kept job (its key and, for a baseline, its record)."""
        return json.loads((folder / DONE).read_text())

    def scratch(self, name) -> Path:
        """A new folder for the job to write into; ``keep`` makes it the kept one."""
        path = self.root / self._unfinished(name)
        path.mkdir(parents=True)
        return path

    def keep(self, scratch: Path, name, key, about: dict) -> Path:
        """Move a finished job's folder to its key and return where it is now. Another process (an xdist
        worker, another session) may have kept the same key meanwhile: its folder may be in use, so it stays
        and this one is dropped; only a fresh run replaces a kept folder."""
        (scratch / DONE).write_text(json.dumps({"key": key, **about}, indent=1) + "\n")
        final = self.folder(name, key)
        old = None
        if (final / DONE).is_file() and not self.fresh:
            shutil.rmtree(scratch, ignore_errors=True)
            return final
        if final.exists():
            old = final.rename(self.root / self._unfinished(f"old-{name}"))
        scratch.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final
