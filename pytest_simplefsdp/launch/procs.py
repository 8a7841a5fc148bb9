"""The processes of cells: markers, ownership, the sweep, kills, and the environment ranks start with.

Every process of a cell carries ``SIMPLEFSDP_CELL=<token>`` in its environment; the runner is a child
subreaper, so a process that sheds its session and environment still comes back to it (``orphans_since``).
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil

from ..commands import RankCommand
from ..paths import SHIM_DIR
from .spec import LaunchSpec

MARKER = "SIMPLEFSDP_CELL"
TERM_GRACE_S = 3.0

SESSION = uuid.uuid4().hex[:8]  # in every token: the end-of-session sweep finds this run's processes


def cell_token(spec):
    return f"{spec.cell_id}:{SESSION}:{uuid.uuid4().hex[:8]}"


def session_leftovers():
    """Processes of any cell of this pytest session that are still alive."""
    return [p for p in psutil.process_iter(["pid"]) if token_of(p).count(f":{SESSION}:")]


def become_subreaper():
    """PR_SET_CHILD_SUBREAPER on the runner: a process that leaves its cell (setsid, double fork) and
    drops its environment (so no marker) is re-parented to the runner instead of init, where the
    after-cell sweep finds it. Linux only; elsewhere the marker sweep is all there is."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


# Root processes the launchers started, by pid. A sweep must never wait for one of them: a reaped
# child reads as exit code 0 to its Popen (ECHILD), so a rank that raised while a packed cell's
# sweep ran would pass, and its peers would wait for it until the timeout.
_OWNED: dict[int, subprocess.Popen] = {}
_SPAWN = threading.Lock()  # a child between fork and exec is not owned yet and has no marker


def spawn(argv, **kwargs) -> subprocess.Popen:
    """subprocess.Popen for a cell's (or fork server's) root process, owned so no sweep reaps it."""
    with _SPAWN:
        proc = subprocess.Popen(argv, **kwargs)
        _OWNED[proc.pid] = proc
    return proc


def runner_children():
    """The runner's live children that no launcher owns and the runner did not start in its own
    session (subprocess.run of tlparse, sinfo, ...: theirs to wait for). Dead ones are reaped on the
    way: they can only be orphans the runner, as child subreaper, inherited."""
    mine = os.getsid(0)
    out = []
    with _SPAWN:
        for pid in [pid for pid, proc in _OWNED.items() if proc.returncode is not None]:
            del _OWNED[pid]  # reaped by its Popen: the pid may be reused
        for p in psutil.Process().children():
            try:
                if p.pid in _OWNED or os.getsid(p.pid) == mine:
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)
                else:
                    out.append(p)
            except (psutil.NoSuchProcess, ProcessLookupError, ChildProcessError):
                pass
    return out


def orphans_since(before: set):
    """Children the runner got during a cell that carry no cell marker: processes re-parented to the
    runner after they left their cell's session and environment (a cell's processes all start in
    sessions of their own; see runner_children for what is never counted)."""
    return [p for p in runner_children() if p.pid not in before and not token_of(p)]


def token_of(p):
    try:
        return p.environ().get(MARKER, "")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cell_processes(token: str):
    """Every live process whose environment carries this cell's token."""
    return [p for p in psutil.process_iter(["pid"]) if p.pid != os.getpid() and token_of(p) == token]


def kill_cell(token: str, grace: float = TERM_GRACE_S):
    """SIGTERM, then SIGKILL, everything carrying the token; returns what was found alive."""
    return kill_procs(cell_processes(token), grace)


def kill_procs(procs, grace: float = TERM_GRACE_S):
    alive = []
    for p in procs:
        try:
            alive.append(f"pid {p.pid} ({' '.join(p.cmdline()[:4])})")
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    rest = _wait_procs(procs, grace)
    for p in rest:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_procs(rest, 5)
    return alive


def _wait_procs(procs, timeout):
    """psutil.wait_procs, but an owned process is waited for through its Popen, which keeps its exit
    code (psutil would reap it and the Popen read 0). Returns the processes still alive."""
    end = time.monotonic() + timeout
    owned = [(p, _OWNED.get(p.pid)) for p in procs]
    rest = []
    for p, proc in owned:
        if proc is not None:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                rest.append(p)
    _, more = psutil.wait_procs([p for p, proc in owned if proc is None], timeout=max(0.0, end - time.monotonic()))
    return rest + more


def die_with_parent(sig=signal.SIGTERM):
    """preexec_fn: the child gets ``sig`` when the runner dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # not Linux: the end-of-session sweep still applies
        return None
    parent = os.getpid()

    def arm():
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the runner died between fork and prctl
            os.kill(os.getpid(), sig)

    return arm


def check_runnable(argv, cwd=None, env=None):
    """Raise the OSError starting ``argv`` would raise (no such program, not executable): a rank starts under its
    reaper, which is always runnable, so the launcher asks first and reports the program's own error."""
    prog = argv[0]
    if os.sep not in prog:
        found = shutil.which(prog, path=(env or os.environ).get("PATH"))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), prog)
        return
    path = os.path.join(cwd or "", prog)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), prog)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), prog)


def python_path(command: RankCommand):
    """The harness's sitecustomize first (stack dumps on SIGUSR1), then the target's, then ours; a version set's
    ranks (versions.envs) see only their environment's and the plugin's: a torchtitan on our path would shadow it."""
    outer = "" if command.env.get("SIMPLEFSDP_VERSIONS") else os.environ.get("PYTHONPATH", "")
    parts = [str(SHIM_DIR), *command.env.get("PYTHONPATH", "").split(os.pathsep), *outer.split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def rank_env(spec: LaunchSpec, token: str):
    env = dict(os.environ)
    env.update(spec.command.env)
    env["PYTHONPATH"] = python_path(spec.command)
    env.update(
        {
            MARKER: token,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(spec.port),
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
        }
    )
    return env


def rank_vars(rank: int, local_rank: int, nproc: int, token: str):
    """What torchrun sets for one of its workers (besides MASTER_ADDR/PORT, which rank_env sets)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(nproc),
        "TORCHELASTIC_RUN_ID": token,
    }


def worker_vars(spec, r: int, base: dict, token: str):
    """Local worker ``r`` of a cell: torchrun's variables; under --virtual-local-rank (RankCommand.virtual_local_rank)
    it is local rank 0 and sees only its own GPU, as torchrun makes it."""
    out = rank_vars(spec.first_rank + r, r, spec.nproc, token)
    if spec.command.virtual_local_rank:
        visible = [d for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        out.update(LOCAL_RANK="0", CUDA_VISIBLE_DEVICES=visible[r] if r < len(visible) else str(r))
    return out


def quote_env(env: dict):
    return " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())


def interpreter(argv) -> str:
    """The Python a command runs with: its own where it is ``python -m ...`` (a version set's environment has its
    own), else this one."""
    return argv[0] if python_module(argv) else sys.executable


def python_module(argv):
    """``[python, -m, mod, args...]`` -> (mod, args); else None."""
    if len(argv) >= 3 and argv[1] == "-m" and Path(argv[0]).name.startswith("python"):
        return argv[2], argv[3:]
    return None
