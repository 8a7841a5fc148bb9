"""What a rank imported, recorded as it imports it (it changes nothing): for each package the launch asks it to
prove (``SIMPLEFSDP_PROVES=torch,torchtitan``), the folder it was imported from, its version, and for the code
under test (torchtitan) the commit it came from (its git checkout's ``HEAD``, else the commit pip or uv installed it
from) and a content hash of its ``.py`` files: section ``imported`` of ``rank<R>.json``. With torch, what decides a
CPU rank's bits: section ``machine`` (the kernels' ISA, MKL's branch, oneDNN's cap, threads, the CPU's model,
vector flags and caches).
judge.provenance reads both.

A fork server imports before it forks: what it found is kept and written by each forked rank (``after_fork``).
Standard library only: this runs in the ranks of any environment."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from . import record
from .hooks import after_import

HASHED = ("torchtitan",)  # the code under test: a content hash proves which copy ran (torch's is 30 MB of .py)
FOUND = {}  # package -> its identity, once imported in this process (a forked rank inherits the server's)


def tree_hash(folder) -> str:
    """sha256 over the package's ``.py`` files (their paths relative to it, and their bytes), in a fixed order."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                h.update(os.path.relpath(path, folder).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def git_commit(folder) -> tuple[str | None, bool]:
    """(HEAD of the git checkout whose tracked files ``folder`` holds, whether they differ from it); (None, False)
    where the folder's files are not tracked there (an environment's copy inside a checkout's ignored folders)."""

    def git(*args):
        return subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=20)

    try:
        tracked = git("ls-files", "--", "__init__.py")
        if tracked.returncode != 0 or not tracked.stdout.strip():
            return None, False
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no", "--", ".")
        return (head.stdout.strip() or None) if head.returncode == 0 else None, bool(dirty.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return None, False


def distribution(name, folder):
    """The installed distribution ``name`` where its files are the ones in ``folder`` (else None)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
        return dist if os.path.realpath(str(dist.locate_file(name))) == os.path.realpath(folder) else None
    except (metadata.PackageNotFoundError, OSError):
        return None


def identity(name, module) -> dict:
    folder = os.path.dirname(os.path.realpath(module.__file__))
    dist = distribution(name, folder)
    out = {"file": folder, "version": dist.version if dist else str(getattr(module, "__version__", "") or "")}
    if name in HASHED:
        commit, dirty = git_commit(folder)
        if commit is None and dist is not None:  # what pip or uv recorded installing it (PEP 610)
            try:
                commit = (json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info") or {}).get("commit_id")
            except ValueError:
                commit = None
        out.update(commit=commit, tree=tree_hash(folder))
        if dirty:
            out["dirty"] = True
    return out


NUMERICS_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")  # what picks CPU kernels
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512", "amx", "avx_vnni")  # what AUTO dispatch follows


@functools.cache
def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo (read once per process: reuse keys ask for every job)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def cpu_flags() -> list[str]:
    return sorted(f for f in _cpuinfo().get("flags", "").split() if f.startswith(VECTOR_FLAGS))


def cpu_model() -> tuple[str, dict]:
    """The CPU's model name and its per-core caches (L1d, L2: oneDNN sizes its blocks, so its summation order, by
    them)."""
    model = _cpuinfo().get("model name", "")
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / n).read_text().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction" and level in ("1", "2"):
            caches[f"L{level}"] = size
    return model, caches


def gpu_machine(torch, driver_dir="/proc/driver/nvidia") -> dict:
    """What decides a GPU rank's bits besides its code, data and torch: the GPU's model, the driver and the CUDA
    torch was built with (cuBLAS and cuDNN pick their kernels by them). Read from the driver's /proc files and
    torch's build info: nothing here initialises CUDA (a rank forked after it must still be able to). {} on a host
    without NVIDIA's driver."""
    models = set()
    for info in Path(driver_dir, "gpus").glob("*/information"):
        try:
            models |= {
                v.strip() for k, _, v in (ln.partition(":") for ln in info.read_text().splitlines()) if k == "Model"
            }
        except OSError:
            continue
    try:
        driver = Path(driver_dir, "version").read_text().split("Kernel Module", 1)[1].split()[0]
    except (OSError, IndexError):
        driver = None
    if not models and not driver:
        return {}
    return {"gpu": ", ".join(sorted(models)), "driver": driver, "cuda": torch.version.cuda}


def numerics_machine(torch) -> dict:
    """What decides a CPU rank's bits besides its code and data: the ISA of ATen's kernels (the CPU's, or
    ATEN_CPU_CAPABILITY's), MKL's code branch (MKL_CBWR; AUTO follows the CPU), oneDNN's ISA cap, the intra-op
    threads, the CPU's model, vector flags and caches. Read from the environment, cpuinfo and sysfs: nothing here
    starts a thread pool (a fork server forks after it). A GPU rank's (no CPU patch set: SIMPLEFSDP_CPU_SHIM unset)
    adds its GPU's (gpu_machine)."""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - an older torch: the field is left out, never the rank
        capability = None
    model, caches = cpu_model()
    return {
        "aten": capability,
        "mkl": os.environ.get("MKL_CBWR", "AUTO"),
        "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL"),
        "threads": os.environ.get("OMP_NUM_THREADS", ""),
        "model": model,
        "caches": caches,
        "flags": cpu_flags(),
        **({} if os.environ.get("SIMPLEFSDP_CPU_SHIM") else gpu_machine(torch)),
    }


MACHINE = {}


def _found(name):
    def seen(module):
        FOUND[name] = identity(name, module)
        if name == "torch":
            MACHINE.update(numerics_machine(module))
        write()

    return seen


def write():
    """This rank's record of what it imported so far (no record folder, as in a fork server: kept for its ranks)."""
    if FOUND:
        record.write("imported", {**FOUND, "python": sys.executable})
    if MACHINE:
        record.write("machine", MACHINE)


def start(env=os.environ):
    for name in filter(None, (p.strip() for p in env.get("SIMPLEFSDP_PROVES", "").split(","))):
        after_import(name, f"imported:{name}")(_found(name))


def after_fork():
    write()
