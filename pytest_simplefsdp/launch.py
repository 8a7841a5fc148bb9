"""Step 3: launch one cell's ranks, watch them, and leave no process behind.

Three launchers share one supervisor:

* ``torchrun`` — the reference: exactly ``torchrun --nproc-per-node N ... -m torchtitan.train``,
  as a user would type it; torchrun writes one log per rank.
* ``local`` — the runner starts the N rank processes itself with the environment torchrun
  would give them (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...). No torch import in
  the runner, so it suits fast fake targets and 1-rank cells.
* ``fork`` — a server imports torch and the target once and forks fresh ranks for every cell
  (forkserver.py); programs that are not ``python -m module`` run under ``local`` instead.

Every process of a cell carries ``SIMPLEFSDP_CELL=<token>`` in its environment. After the cell
(and on a timeout, after a stack dump through SIGUSR1) everything carrying the token is killed,
and anything that had to be killed after a clean finish is reported as a survivor.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .targets import SHIM_DIR, RankCommand

MARKER = "SIMPLEFSDP_CELL"
POLL_S = 0.05
TERM_GRACE_S = 3.0
STACK_DUMP_WAIT_S = 1.5


@dataclass
class LaunchSpec:
    cell_id: str
    command: RankCommand
    nproc: int
    log_dir: Path
    timeout: float
    port: int
    log_limit_bytes: int = 512 * 2**20
    first_rank: int = 0  # ranks first_rank .. first_rank+nproc-1 run here (the trace tier runs one)
    device: str = "cpu"  # the profile's device (a scheduler asks for GPUs for cuda cells)


@dataclass
class LaunchOutcome:
    exit_codes: dict = field(default_factory=dict)  # rank -> exit code (negative: signal)
    first_failed_rank: int | None = None
    timed_out: bool = False
    stuck_ranks: list = field(default_factory=list)
    log_flood: int = 0  # the log limit in bytes that the cell's output passed
    wall: float = 0.0
    rank_logs: dict = field(default_factory=dict)  # rank -> [paths]
    launcher_log: Path | None = None
    survivors: list = field(default_factory=list)  # descriptions of processes killed after a clean end
    reproducer: str = ""
    launch_error: str | None = None
    port: int | None = None
    notes: list = field(default_factory=list)


SESSION = uuid.uuid4().hex[:8]  # in every token: the end-of-session sweep finds this run's processes


def cell_token(spec):
    return f"{spec.cell_id}:{SESSION}:{uuid.uuid4().hex[:8]}"


def session_leftovers():
    """Processes of any cell of this pytest session that are still alive."""
    return [p for p in psutil.process_iter(["pid"]) if _token_of(p).count(f":{SESSION}:")]


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


def _runner_children():
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
    sessions of their own; see _runner_children for what is never counted)."""
    return [p for p in _runner_children() if p.pid not in before and not _token_of(p)]


def _token_of(p):
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
    return [p for p in psutil.process_iter(["pid"]) if p.pid != os.getpid() and _token_of(p) == token]


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


def _python_path(command: RankCommand):
    """The harness's sitecustomize first (stack dumps on SIGUSR1), then the target's, then ours."""
    parts = [str(SHIM_DIR), *command.env.get("PYTHONPATH", "").split(os.pathsep),
             *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def rank_env(spec: LaunchSpec, token: str):
    env = dict(os.environ)
    env.update(spec.command.env)
    env["PYTHONPATH"] = _python_path(spec.command)
    env.update({MARKER: token, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(spec.port),
                "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
    return env


def quote_env(env: dict):
    return " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())


def _python_module(argv):
    """``[python, -m, mod, args...]`` -> (mod, args); else None."""
    if len(argv) >= 3 and argv[1] == "-m" and Path(argv[0]).name.startswith("python"):
        return argv[2], argv[3:]
    return None


class Supervisor:
    """Waits for a set of root processes; handles timeout, failure tear-down and log floods."""

    def __init__(self, spec, token, outcome, finder=None):
        self.spec, self.token, self.outcome = spec, token, outcome
        self.find = finder or (lambda: cell_processes(token))  # every process of the cell

    def kill(self, grace=TERM_GRACE_S):
        return kill_procs(self.find(), grace)

    def logs_size(self, now):
        if now - self._listed > 1.0:  # the file list is cheap to keep, the sizes are read every poll
            self._listed, self._logs = now, list(self.spec.log_dir.rglob("*.log"))
        total = 0
        for path in self._logs:
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    def cap_logs(self):
        """After a flood: cut every log to the limit and say so at its end."""
        for path in self.spec.log_dir.rglob("*.log"):
            if path.stat().st_size > self.spec.log_limit_bytes // 2:
                os.truncate(path, self.spec.log_limit_bytes // 2)
                with open(path, "ab") as f:
                    f.write(b"\n[simplefsdp] log cut here: the cell's output passed the log limit\n")

    def dump_stacks(self):
        for p in self.find():
            try:
                p.send_signal(signal.SIGUSR1)
            except psutil.NoSuchProcess:
                pass
        time.sleep(STACK_DUMP_WAIT_S)

    def run(self, procs: dict, on_first_failure=None, alive_ranks=None):
        """procs: key -> Popen. Returns once all ended (or were killed).

        ``alive_ranks()`` names the ranks still running (default: the keys of live procs)."""
        start = time.monotonic()
        before = {p.pid for p in _runner_children()} | {p.pid for p in procs.values()}
        try:
            self._watch(procs, on_first_failure, alive_ranks, start)
        except BaseException:  # Ctrl-C / SIGTERM of the runner: leave nothing behind
            self.kill(grace=1.0)
            kill_procs(orphans_since(before), grace=0.5)
            raise
        self.outcome.wall = time.monotonic() - start
        self.outcome.survivors = self.kill() + kill_procs(orphans_since(before), grace=0.5)

    def deadline(self, start, now):
        """When the cell counts as hung (a scheduler's launcher starts the clock later)."""
        return start + self.spec.timeout

    def on_deadline(self, procs, alive_ranks):
        """The cell ran past its timeout: dump every rank's stack, note who was still running, stop it."""
        self.outcome.timed_out = True
        self.dump_stacks()
        self.outcome.stuck_ranks = sorted(alive_ranks() if alive_ranks else
                                          (k for k in procs if k not in self.outcome.exit_codes))
        self.kill()

    def _watch(self, procs, on_first_failure, alive_ranks, start):
        self._listed, self._logs = -1e9, []
        torn_down = None  # when the first failure's tear-down (SIGTERM) went out
        while True:
            for key, p in procs.items():
                code = p.poll()
                if code is not None and key not in self.outcome.exit_codes:
                    self.outcome.exit_codes[key] = code
                    if code != 0 and on_first_failure and self.outcome.first_failed_rank is None:
                        on_first_failure(key, code, procs)
                        torn_down = time.monotonic()
            if len(self.outcome.exit_codes) == len(procs):
                # ranks that wrote past the limit and exited between two polls: sizes once more, every file
                self._listed = -1e9
                if self.logs_size(time.monotonic()) > self.spec.log_limit_bytes:
                    self.outcome.log_flood = self.spec.log_limit_bytes
                    self.cap_logs()
                break
            now = time.monotonic()
            if torn_down is not None and now > torn_down + TERM_GRACE_S:
                # a peer that ignores SIGTERM must not turn the first failure into a hang
                self.outcome.notes.append(f"ranks still running {TERM_GRACE_S:.0f} s after rank "
                                          f"{self.outcome.first_failed_rank} failed were killed (SIGKILL)")
                self.kill(grace=0.0)
                for key, p in procs.items():
                    self.outcome.exit_codes.setdefault(key, p.wait())
                break
            if now > self.deadline(start, now):
                self.on_deadline(procs, alive_ranks)
                for key, p in procs.items():
                    self.outcome.exit_codes.setdefault(key, p.wait())
                break
            if self.logs_size(now) > self.spec.log_limit_bytes:
                self.outcome.log_flood = self.spec.log_limit_bytes
                self.kill(grace=0.5)
                for key, p in procs.items():
                    self.outcome.exit_codes.setdefault(key, p.wait())
                self.cap_logs()
                break
            time.sleep(POLL_S)


class LocalLauncher:
    """Starts the ranks itself, with the environment torchrun would set."""

    name = "local"
    remote = False  # the ranks run on this host: its GPUs and rank budget apply

    def reproducer(self, spec: LaunchSpec):
        env = quote_env(spec.command.env)
        cd = f"cd {shlex.quote(spec.command.cwd)} && " if spec.command.cwd else ""
        ranks = " & ".join(
            f"RANK={spec.first_rank + r} LOCAL_RANK={r} WORLD_SIZE={spec.nproc} LOCAL_WORLD_SIZE={spec.nproc} "
            f"MASTER_ADDR=127.0.0.1 MASTER_PORT={spec.port} {env + ' ' if env else ''}{shlex.join(spec.command.argv)}"
            for r in range(spec.nproc))
        return f"{cd}{ranks} & wait"

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        token = cell_token(spec)
        out = LaunchOutcome(reproducer=self.reproducer(spec), port=spec.port)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            procs, finder, close = self._start(spec, token, out)
        except OSError as e:
            out.launch_error = f"cannot start {spec.command.argv[0]!r}: {e.strerror or e}"
            kill_cell(token)
            return out

        def tear_down(rank, code, procs):
            out.first_failed_rank = rank
            for p in procs.values():
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

        try:
            Supervisor(spec, token, out, finder).run(procs, tear_down)
        finally:
            close()
        return out

    def _start(self, spec, token, out):
        """Start the ranks: (rank -> process, finder of the cell's processes, clean-up)."""
        base = rank_env(spec, token)
        procs, files = {}, []
        try:
            for r in range(spec.nproc):
                env = dict(base, RANK=str(spec.first_rank + r), LOCAL_RANK=str(r), GROUP_RANK="0",
                           ROLE_RANK=str(spec.first_rank + r),
                           WORLD_SIZE=str(spec.nproc), LOCAL_WORLD_SIZE=str(spec.nproc),
                           ROLE_WORLD_SIZE=str(spec.nproc), TORCHELASTIC_RUN_ID=token)
                log = spec.log_dir / f"rank{r}.log"
                out.rank_logs[r] = [log]
                f = open(log, "wb")
                files.append(f)
                procs[r] = spawn(spec.command.argv, env=env, cwd=spec.command.cwd, stdout=f,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        except OSError:
            for f in files:
                f.close()
            raise

        def close():
            for f in files:
                f.close()

        return procs, None, close


class TorchrunLauncher:
    """``torchrun`` with per-rank log files; the reference launcher."""

    name = "torchrun"
    remote = False

    def torchrun_argv(self, spec: LaunchSpec, nproc=None, addr="127.0.0.1", log_dir=None, nodes=()):
        """torchrun for the cell; ``nodes``: extra rendezvous options of a multi-node run."""
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc or spec.nproc}",
                *nodes, f"--master-addr={addr}", f"--master-port={spec.port}", "--max-restarts=0",
                f"--log-dir={log_dir or spec.log_dir / 'torchrun'}", "--redirects=3"]
        module = _python_module(spec.command.argv)
        if module:
            return argv + ["-m", module[0], *module[1]]
        return argv + ["--no-python", *spec.command.argv]

    def reproducer(self, spec: LaunchSpec):
        module = _python_module(spec.command.argv)
        exe = Path(sys.executable).parent / "torchrun"  # the environment's own, so it runs from any shell
        head = f"{exe if exe.exists() else 'torchrun'} --nproc-per-node={spec.nproc} --master-port={spec.port}"
        body = f"-m {module[0]} {shlex.join(module[1])}" if module else f"--no-python {shlex.join(spec.command.argv)}"
        cd = f"cd {shlex.quote(spec.command.cwd)} && " if spec.command.cwd else ""
        return f"{cd}{quote_env(spec.command.env)} {head} {body}".strip()

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        token = cell_token(spec)
        out = LaunchOutcome(reproducer=self.reproducer(spec), port=spec.port)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        out.launcher_log = spec.log_dir / "torchrun.log"
        with open(out.launcher_log, "wb") as f:
            try:
                proc = spawn(self.torchrun_argv(spec), env=rank_env(spec, token),
                                        cwd=spec.command.cwd, stdout=f, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=die_with_parent(signal.SIGTERM))  # torchrun stops its workers
            except OSError as e:
                out.launch_error = f"cannot start torchrun: {e.strerror or e}"
                return out
            Supervisor(spec, token, out).run({"torchrun": proc}, alive_ranks=lambda: self._ranks_of(proc, token))
        code = out.exit_codes.pop("torchrun", None)
        for r in range(spec.nproc):
            out.rank_logs[r] = sorted((spec.log_dir / "torchrun").glob(f"*/attempt_*/{r}/std*.log"))
        self._read_root_cause(out, code)
        return out

    @staticmethod
    def _ranks_of(proc, token):
        """The RANKs of torchrun's live workers (its direct children carrying the token)."""
        ranks = set()
        for p in cell_processes(token):
            try:
                if p.ppid() == proc.pid and "RANK" in p.environ():
                    ranks.add(int(p.environ()["RANK"]))
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                pass
        return ranks

    @staticmethod
    def _read_root_cause(out: LaunchOutcome, code):
        """torchrun's summary names the first failed rank and its exit code or signal."""
        text = out.launcher_log.read_text(errors="replace") if out.launcher_log else ""
        if "Root Cause (first observed failure)" in text:
            block = text.split("Root Cause (first observed failure)", 1)[1]
            rank = exitcode = None
            for line in block.splitlines()[:12]:
                key, _, value = line.strip().partition(":")
                if key.strip() == "rank" and rank is None:
                    rank = int(value.split()[0])
                elif key.strip() == "exitcode" and exitcode is None:
                    exitcode = int(value.split()[0])
            if rank is not None:
                out.first_failed_rank = rank
                out.exit_codes[rank] = exitcode
        if code not in (0, None) and out.first_failed_rank is None and not out.timed_out:
            out.exit_codes.setdefault("launcher", code)


class _ServerRank:
    """A rank forked by the fork server: Popen's poll/wait over the server's reports."""

    def __init__(self, pid):
        self.pid, self.returncode, self.done = pid, None, threading.Event()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.done.wait(timeout)
        return self.returncode


class _ForkServer:
    def __init__(self, command: RankCommand, preload, key):
        self.marker = f"forkserver:{SESSION}:{key}"
        env = dict(os.environ, **command.env, **{MARKER: self.marker, "PYTHONUNBUFFERED": "1"})
        env["PYTHONPATH"] = _python_path(command)
        self.errors = tempfile.TemporaryFile()  # the server's own stderr: why it did not start
        self.proc = spawn([sys.executable, "-m", "pytest_simplefsdp.forkserver", *preload], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True,
                                     bufsize=1, cwd=command.cwd, preexec_fn=die_with_parent(signal.SIGKILL))
        self.ranks, self.replies = {}, []
        self.changed = threading.Condition()
        first = self.proc.stdout.readline()
        if not first.startswith('{"ready"'):
            self.close()  # a server that did not start is not left behind
            self.errors.seek(0)
            tail = [line for line in self.errors.read().decode(errors="replace").splitlines() if line.strip()]
            raise OSError(f"fork server did not start (preloading {' '.join(preload)}): "
                          f"{tail[-1] if tail else 'it exited without a word'}")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                if "pids" in msg:
                    self.replies.append(msg["pids"])
                else:
                    rank = self.ranks[msg["rank"]]
                    rank.returncode = msg["code"]
                    rank.done.set()
                self.changed.notify_all()

    def start(self, request):
        with self.changed:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            if not self.changed.wait_for(lambda: self.replies, timeout=60):
                raise OSError("fork server did not answer")
            pids = self.replies.pop()
            self.ranks = {r: _ServerRank(pid) for r, pid in enumerate(pids)}
        return self.ranks

    def processes(self):
        """The cell's processes: everything carrying the server's marker but the server."""
        return [p for p in psutil.process_iter(["pid"]) if p.pid != self.proc.pid and _token_of(p) == self.marker]

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        kill_procs([psutil.Process(self.proc.pid)] + self.processes(), grace=2)


class ForkLauncher(LocalLauncher):
    """A long-lived server per target environment imports torch and the target once, then forks
    one fresh child per rank per cell (see forkserver.py). Programs that are not ``python -m
    module`` need a fresh interpreter: they run under the local launcher, and the cell says so.

    Known limit: environment read at import time (e.g. TORCH_TRACE) takes the server's value."""

    name = "fork"
    PER_CELL_ENV = ("TORCH_TRACE", "SIMPLEFSDP_EVIDENCE_DIR")  # not part of which server a cell uses

    def __init__(self):
        self.servers = {}

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        if _python_module(spec.command.argv) is None or Path(spec.command.argv[0]) != Path(sys.executable):
            out = LocalLauncher().launch(spec)
            out.notes.append("fork launcher: not a `python -m module` program of this interpreter; "
                             "ran under the local launcher")
            return out
        return super().launch(spec)

    def _server(self, command: RankCommand):
        env = {k: v for k, v in command.env.items() if k not in self.PER_CELL_ENV}
        key = json.dumps([env, command.cwd, command.preload], sort_keys=True)
        if key not in self.servers:
            module = _python_module(command.argv)[0]
            self.servers[key] = _ForkServer(RankCommand(command.argv, env, command.cwd),
                                            [module, *command.preload], len(self.servers))
        return self.servers[key]

    def _start(self, spec, token, out):
        server = self._server(spec.command)
        module, args = _python_module(spec.command.argv)
        env = rank_env(spec, token)
        env["TORCHELASTIC_RUN_ID"] = token
        logs = [str(spec.log_dir / f"rank{r}.log") for r in range(spec.nproc)]
        for r, log in enumerate(logs):
            out.rank_logs[r] = [Path(log)]
        ranks = server.start({"nproc": spec.nproc, "first_rank": spec.first_rank, "module": module, "args": args,
                              "env": env, "logs": logs, "cwd": spec.command.cwd})
        return ranks, server.processes, lambda: None

    def close(self):
        for server in self.servers.values():
            server.close()
        self.servers.clear()


LAUNCHERS = {"torchrun": TorchrunLauncher, "local": LocalLauncher, "fork": ForkLauncher}
