"""What this machine and environment offer a run: the installed versions, the host, its GPUs and the git
revisions torch and torchtitan were built from (read from files: nothing heavy is imported)."""

from __future__ import annotations

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

from .shim.provenance import tree_hash


def installed(package) -> str:
    """The installed version of a distribution, or "" where it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def package_root(package) -> Path | None:
    """Where an installed package's files are (found without importing it), else None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


# the trainer each torchtitan generation ships, as a folder of the package: what a target needs is decided by what
# is there, never by the version string (torchtitan main has said 0.2.2 since before graph_trainer)
TRAINERS = {"graph_trainer": "experiments/graph_trainer", "simple_fsdp": "experiments/simple_fsdp"}


def torchtitan_trainers() -> set[str]:
    """The SimpleFSDP trainers the installed torchtitan ships (graph_trainer: 0.3.0 and main; simple_fsdp: 0.2.x)."""
    root = package_root("torchtitan")
    return {name for name, folder in TRAINERS.items() if root and (root / folder).is_dir()}


@functools.lru_cache(maxsize=None)
def versions():
    """The versions a report and a known-failure condition name (read once per session)."""
    out = {"python": platform.python_version()}
    out.update({pkg: installed(pkg) for pkg in ("torch", "torchtitan") if installed(pkg)})
    return out


@functools.lru_cache(maxsize=None)
def machine():
    """Where a run ran, for its meta record: the host, its GPUs (nvidia-smi's names) and the git revisions
    torch and torchtitan were built from."""
    gpus = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            ).stdout
            gpus = [line.strip() for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {
        "host": platform.node(),
        "gpus": gpus,
        "revisions": {
            k: v for k, v in (("torch", _torch_git_version()), ("torchtitan", vcs_commit("torchtitan"))) if v
        },
    }


def _torch_git_version():
    spec = importlib.util.find_spec("torch")
    try:
        text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    except OSError:
        return None
    m = re.search(r"^git_version\s*=\s*['\"]([0-9a-f]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _direct_url(package):
    try:
        text = metadata.distribution(package).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return {}
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def vcs_commit(package):
    """The commit a package was installed from (pip's direct_url.json for a git or local checkout), else None."""
    return (_direct_url(package).get("vcs_info") or {}).get("commit_id")


def source_checkout(package) -> Path | None:
    """The local folder an editable install of ``package`` runs from (``pip install -e <checkout>``), else None."""
    info = _direct_url(package)
    url = info.get("url", "")
    if (info.get("dir_info") or {}).get("editable") and url.startswith("file://"):
        return Path(url[len("file://") :])
    return None


def installed_folder(package) -> str | None:
    """Where the installed distribution of ``package`` keeps the package (an editable install: its checkout's),
    read from its metadata: what the environment installed, whatever else is first on a path."""
    checkout = source_checkout(package)
    if checkout is not None:
        return str(checkout / package)
    try:
        return str(metadata.distribution(package).locate_file(package))
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def installed_commit() -> tuple[str, str | None] | None:
    """(commit, checkout) the installed torchtitan runs: an editable checkout's HEAD and that checkout, or the commit
    pip installed it from (no checkout known); None for a release."""
    checkout = source_checkout("torchtitan")
    if checkout is not None and (checkout / ".git").exists():
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            return head.stdout.strip(), str(checkout)
    commit = vcs_commit("torchtitan")
    return (commit, None) if commit else None


@functools.lru_cache(maxsize=None)
def code_identity(package="torchtitan") -> str | None:
    """A content hash of the installed ``package``'s code (its ``.py`` files, as a rank proves what it imported):
    an editable checkout's edits change it, though its version and install commit stay."""
    folder = installed_folder(package)
    return tree_hash(folder) if folder and os.path.isdir(folder) else None


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
