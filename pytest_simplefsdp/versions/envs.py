"""An environment per version set, built on demand with uv and kept under ``.simplefsdp/envs/<set>-<key>/``: the
key hashes what it was built from (the Python, the requirements), so a later run with the same set reuses it, and
``--simplefsdp-fresh`` builds it again. It holds the target's own requirements (torch, torchtitan, triton, psutil);
the plugin's rank side (the shim, the fork server, the option probe) comes from the running plugin, linked into
the environment's path, so the ranks run exactly the code that judges them.

An environment that cannot be built is an ``EnvError`` carrying the installer's own line; the cells of that set
fail as infra with it, once built or not, and the other sets run."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..machine import installed
from ..paths import PACKAGE
from ..words import release
from .sets import VersionSet

DONE = "env.json"  # written last: a folder without it was never finished (built again)
PLUGIN = "simplefsdp-plugin"  # the folder on the ranks' path that holds a link to the running plugin's package
DEFAULT_BYTES = 8 * 2**30  # what one environment with a CUDA build of torch takes on disk, until one is measured
BUILD_TIMEOUT_S = 3600.0


class EnvError(Exception):
    """A version set's environment that cannot be had; the message is the installer's (or the disk's) line."""


@dataclass(frozen=True)
class Env:
    vset: VersionSet
    folder: Path
    python: Path
    plugin_path: Path  # the folder that makes the running plugin importable in the environment
    versions: dict  # package -> version installed there (read back after the build)
    built_now: bool = False
    seconds: float = 0.0  # how long the build took (0: kept from an earlier run)


class Environments:
    def __init__(self, root: Path, fresh: bool = False, torchtitan_repo: Path | None = None):
        self.root, self.fresh, self.repo = Path(root), fresh, torchtitan_repo
        self.made = {}  # label -> Env | EnvError, this session's
        self.lock = threading.Lock()

    def requirements(self, vset: VersionSet, requires=()) -> list[str]:
        """What the set's environment installs: its pins, and for the packages the target ``requires`` beyond them
        (a torchtitan target: torch, torchtitan, triton, psutil) the versions pytest runs with, or the newest."""
        out = []
        for package in ("torch", "torchtitan"):
            pin = vset.get(package) or (release(installed(package)) if package in requires else "")
            if pin.startswith("@"):
                if self.repo is None:
                    raise EnvError(
                        f"{vset.label()}: a torchtitan commit needs its git checkout "
                        f"(--simplefsdp-torchtitan-repo=PATH)"
                    )
                out.append(f"torchtitan @ git+file://{Path(self.repo).resolve()}@{pin[1:]}")
            elif pin:
                out.append(f"{package}=={pin}")
        return out + [p for p in requires if p not in ("torch", "torchtitan")]

    def key(self, vset: VersionSet, requires=()) -> str:
        text = json.dumps({"python": sys.version, "requirements": self.requirements(vset, requires)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def folder(self, vset: VersionSet, requires=()) -> Path:
        """Where the set's environment is (or will be): known without building it (a dry run names it)."""
        return self.root / f"{vset.slug()}-{self.key(vset, requires)}"

    def get(self, vset: VersionSet, requires=()) -> Env:
        """The set's environment, built now if no earlier run kept it; EnvError where it cannot be."""
        with self.lock:
            key = (vset.label(), tuple(requires))
            if key not in self.made:
                try:
                    self.made[key] = self._get(vset, tuple(requires))
                except EnvError as e:
                    self.made[key] = e
            found = self.made[key]
        if isinstance(found, EnvError):
            raise found
        return found

    def _get(self, vset, requires):
        folder = self.folder(vset, requires)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{folder.name}.lock", "w") as lock:  # another session may build the same one
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (folder / DONE).is_file() and not self.fresh:
                about = json.loads((folder / DONE).read_text())
                return Env(vset, folder, folder / "bin" / "python", folder / PLUGIN, about["versions"])
            return self._build(vset, folder, requires)

    def _build(self, vset, folder, requires):
        uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
        if uv is None:
            raise EnvError("uv is not installed here: pip install uv (or pytest-simplefsdp[versions])")
        need, free = self.needed(), shutil.disk_usage(self.root).free
        if free < need:
            raise EnvError(
                f"refused to build the {vset.label()} environment: it needs about {need / 2**30:.1f} GiB "
                f"and {self.root} has {free / 2**30:.1f} GiB free"
            )
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished one, or the old one under --simplefsdp-fresh
        start = time.monotonic()
        env = {**os.environ, "VIRTUAL_ENV": str(folder)}
        env.pop("PYTHONPATH", None)
        # UV_NO_INDEX (only wheels of UV_FIND_LINKS: offline, or nightlies in a folder): uv has the flag, not the
        # variable, so it is passed on as the flag
        only_links = ["--no-index"] if os.environ.get("UV_NO_INDEX", "").lower() not in ("", "0", "false") else []
        for argv in (
            [uv, "venv", "--quiet", "--python", sys.executable, str(folder)],
            [
                uv,
                "pip",
                "install",
                "--quiet",
                *only_links,
                "--python",
                str(folder / "bin" / "python"),
                *self.requirements(vset, requires),
            ],
        ):
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise EnvError(f"{vset.label()}: uv took longer than {BUILD_TIMEOUT_S:.0f} s") from None
            if proc.returncode != 0:
                shutil.rmtree(folder, ignore_errors=True)
                raise EnvError(f"{vset.label()}: {installer_line(proc.stderr or proc.stdout)}")
        plugin = folder / PLUGIN
        plugin.mkdir()
        (plugin / PACKAGE.name).symlink_to(PACKAGE, target_is_directory=True)
        versions = read_versions(folder / "bin" / "python")
        seconds = round(time.monotonic() - start, 1)
        (folder / DONE).write_text(
            json.dumps(
                {
                    "set": vset.label(),
                    "requirements": self.requirements(vset, requires),
                    "versions": versions,
                    "seconds": seconds,
                    "bytes": folder_bytes(folder),
                },
                indent=1,
            )
            + "\n"
        )
        return Env(vset, folder, folder / "bin" / "python", plugin, versions, True, seconds)

    def needed(self) -> int:
        """Bytes one more environment is expected to take: the largest this root has measured, else DEFAULT_BYTES."""
        sizes = []
        for about in self.root.glob(f"*/{DONE}"):
            try:
                sizes.append(int(json.loads(about.read_text()).get("bytes", 0)))
            except (OSError, ValueError):
                continue
        return max(sizes, default=DEFAULT_BYTES) or DEFAULT_BYTES

    def apply(self, command, vset: VersionSet, requires=()):
        """The command as it runs in the set's environment: its interpreter, the plugin's rank side on its path (and
        no other: launch.procs leaves the outer PYTHONPATH out of a set's ranks), a safe import path (Python's -P: a
        ``python -m`` rank started in a torchtitan checkout would import the checkout's torchtitan, not the set's),
        and every pinned package proved by what the ranks import (shim/provenance.py, judge/provenance.py)."""
        if vset.installed:
            return command
        folder = self.folder(vset, requires)
        if command.argv and Path(command.argv[0]) == Path(sys.executable):
            command.argv[0] = str(folder / "bin" / "python")
        paths = [str(folder / PLUGIN), *filter(None, command.env.get("PYTHONPATH", "").split(os.pathsep))]
        command.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        command.env["SIMPLEFSDP_VERSIONS"] = vset.label()
        command.env["PYTHONSAFEPATH"] = "1"
        proves = [*filter(None, command.env.get("SIMPLEFSDP_PROVES", "").split(",")), *(p for p, _ in vset.pins)]
        command.env["SIMPLEFSDP_PROVES"] = ",".join(dict.fromkeys(proves))
        return command


def installer_line(text: str) -> str:
    """The installer's own words for why it failed: its error lines (uv's "error:" and "╰─▶" lines), else its last."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    picked = [line for line in lines if line.startswith(("error:", "×", "╰─▶", "Caused by:"))]
    return " ".join(picked)[:600] if picked else (lines[-1] if lines else "the installer failed without a word")


def read_versions(python: Path) -> dict:
    code = (
        "import importlib.metadata as m, json, sys\nout = {'python': sys.version.split()[0]}\n"
        "for p in ('torch', 'torchtitan', 'triton'):\n    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    proc = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if proc.returncode != 0:
        raise EnvError(f"the new environment's Python does not start: {installer_line(proc.stderr)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def folder_bytes(folder: Path) -> int:
    seen, total = set(), 0
    for path in folder.rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.is_file() and not path.is_symlink() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total
