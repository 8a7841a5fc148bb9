"""The ``fork`` launcher: a server per target environment imports torch and the target once and forks
fresh ranks for every cell (forkserver.py). Programs that are not ``python -m module`` of this
interpreter, or whose target says they cannot be forked (torchtitan 0.2), run under ``local`` instead, and the
cell says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import psutil

from ..commands import RankCommand
from ..words import plural
from .local import LocalLauncher
from .procs import (
    MARKER,
    SESSION,
    cell_processes,
    die_with_parent,
    interpreter,
    kill_procs,
    python_module,
    python_path,
    rank_env,
    spawn,
    token_of,
    worker_vars,
)
from .spec import LaunchOutcome, LaunchSpec


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
    def __init__(self, command: RankCommand, preload, key, start_timeout=600.0):
        self.marker = f"forkserver:{SESSION}:{key}"
        env = dict(os.environ, **command.env, **{MARKER: self.marker, "PYTHONUNBUFFERED": "1"})
        env["PYTHONPATH"] = python_path(command)
        env.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")  # one thread to fork from (forkserver.py)
        self.errors = tempfile.TemporaryFile()  # the server's own stderr: why it did not start
        self.proc = spawn(
            [interpreter(command.argv), "-m", "pytest_simplefsdp.launch.forkserver", *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            bufsize=1,
            cwd=command.cwd,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        self.preload = preload
        self.ranks: dict = {}
        self.replies: list = []
        self.busy, self.ready = False, None
        self.exit = None  # why the server ended on its own, once it has: its exit code and last stderr line
        self.closing = False  # ended by close(): not an incident
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        with self.changed:  # bounded: an import that blocks must not hold the run (the cell's clock starts later)
            ready = self.ready if self.changed.wait_for(lambda: self.ready is not None, timeout=start_timeout) else None
        if not ready:
            self.close()  # a server that did not start is not left behind
            self.errors.seek(0)
            tail = [line for line in self.errors.read().decode(errors="replace").splitlines() if line.strip()]
            why = (
                f"still importing after {start_timeout:.0f} s (the cell's timeout)"
                if ready is None
                else tail[-1]
                if tail
                else "it exited without a word"
            )
            raise OSError(f"fork server did not start (preloading {' '.join(preload)}): {why}")

    def _read(self):
        try:
            for line in self.proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # not the protocol: something the preloaded modules printed at import
                with self.changed:
                    if "ready" in msg:
                        self.ready = True
                    elif "pids" in msg:
                        # the ranks are made here, in the order the server speaks: a rank that ends at once is
                        # reported on the next line, which this thread may read before start() wakes up
                        self.ranks = {r: _ServerRank(pid) for r, pid in enumerate(msg["pids"])}
                        self.replies.append((self.ranks, msg.get("threads", [])))
                    else:
                        rank = self.ranks[msg["rank"]]
                        rank.returncode = msg["code"]
                        rank.done.set()
                    self.changed.notify_all()
        finally:
            # the server is gone (its ranks die with it: PR_SET_PDEATHSIG): no rank may wait for a word forever
            if not self.closing:
                self.exit = self._exit_line()
            with self.changed:
                self.ready = bool(self.ready)
                for rank in self.ranks.values():
                    if not rank.done.is_set():
                        rank.returncode = -int(signal.SIGKILL)
                        rank.done.set()
                self.changed.notify_all()

    def _exit_line(self):
        """How the server ended, noticed when its output closed: exit code (or signal) and its last stderr line."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self.errors.seek(0)
        tail = [line for line in self.errors.read().decode(errors="replace").splitlines() if line.strip()]
        how = (
            "still running with its output closed"
            if code is None
            else f"killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        return f"fork server pid {self.proc.pid} (preloading {' '.join(self.preload)}) {how}" + (
            f"; its last line: {tail[-1]}" if tail else ""
        )

    def start(self, request):
        with self.changed:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            if not self.changed.wait_for(lambda: self.replies, timeout=60):
                raise OSError("fork server did not answer")
            return self.replies.pop()

    def processes(self):
        """The cell's processes: everything carrying the server's marker but the server."""
        return [p for p in psutil.process_iter(["pid"]) if p.pid != self.proc.pid and token_of(p) == self.marker]

    def close(self):
        """End the server and whatever it forked; a server that already ended (and was reaped) is fine."""
        self.closing = True
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        procs = self.processes()
        if self.proc.poll() is None:
            try:
                procs.insert(0, psutil.Process(self.proc.pid))
            except psutil.NoSuchProcess:
                pass
        kill_procs(procs, grace=2)


class ForkLauncher(LocalLauncher):
    """A long-lived server per target environment imports torch and the target once, then forks
    one fresh child per rank per cell (see forkserver.py). Programs that are not ``python -m
    module``, and those the target marks ``unforkable``, need a fresh interpreter: they run under the local
    launcher, and the cell says so.

    A server is chosen by the cell's environment, less what differs per cell (its trace and evidence folders):
    torch's logging re-reads the rank's environment in the child (TORCH_TRACE); anything else a module reads at
    import comes from the server, so it must be part of that key."""

    name = "fork"
    PER_CELL_ENV = ("TORCH_TRACE", "SIMPLEFSDP_EVIDENCE_DIR")  # not part of which server a cell uses

    def __init__(self):
        self.servers = {}  # environment key -> its servers; a server runs one cell at a time
        self.count = 0
        self.lock = threading.Lock()
        self.ended = []  # lines of servers that ended before the session did (noticed by their reader thread)

    @staticmethod
    def unforkable(command: RankCommand) -> str | None:
        """Why this launcher runs a command under local instead of forking it, or None."""
        if python_module(command.argv) is None:
            return "not a `python -m module` program"
        return command.unforkable

    def runs_as(self, command: RankCommand) -> str:
        """The launcher that really runs a command: fork, or local for what it cannot fork."""
        return LocalLauncher.name if self.unforkable(command) else self.name

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        why = self.unforkable(spec.command)
        if why:
            out = LocalLauncher().launch(spec)
            out.notes.append(f"fork launcher: {why}; ran under the local launcher")
            return out
        return super().launch(spec)

    def _server(self, command: RankCommand, start_timeout):
        """An idle server of the command's environment, started when none is: cells that run at once
        (--simplefsdp-jobs) each get their own, so a server's marker names exactly one cell's ranks."""
        env = {k: v for k, v in command.env.items() if k not in self.PER_CELL_ENV}
        key = json.dumps([command.argv[0], env, command.cwd, command.preload], sort_keys=True)
        with self.lock:
            pool = self.servers.setdefault(key, [])
            for gone in [s for s in pool if s.exit is not None]:  # an ended server is named once, then dropped
                self.ended += [gone.exit] if gone.exit not in self.ended else []
                pool.remove(gone)
            server = next((s for s in pool if not s.busy and s.proc.poll() is None), None)
            if server is None:
                module = python_module(command.argv)[0]
                self.count += 1
                server = _ForkServer(
                    RankCommand(command.argv, env, command.cwd), [module, *command.preload], self.count, start_timeout
                )
                pool.append(server)
            server.busy = True
        return server

    def _start(self, spec, token, out):
        server = self._server(spec.command, spec.timeout)
        module, args = python_module(spec.command.argv)
        base = rank_env(spec, token)
        envs = [dict(base, **worker_vars(spec, r, base, token)) for r in range(spec.nproc)]
        logs = [str(spec.log_dir / f"rank{r}.log") for r in range(spec.nproc)]
        for r, log in enumerate(logs):
            out.rank_logs[r] = [Path(log)]
        try:
            ranks, others = server.start(
                {"module": module, "args": args, "envs": envs, "logs": logs, "cwd": spec.command.cwd}
            )
        except OSError:
            server.busy = False
            raise
        if others:  # what a rank that crashes or hangs in a lock may have lost
            out.notes.append(
                f"the fork server held {plural(len(others), 'other thread')} when it forked these ranks "
                f"({', '.join(others)}); a forked rank has none of them, and a lock one held stays held"
            )

        def release():
            server.busy = False
            if server.exit is not None:  # it ended while this cell ran: the cell says so
                out.notes.append(server.exit)

        # the cell's processes: its forked ranks (which carry the server's marker) and what they started (which
        # carries the cell's token, as under every other launcher)
        return ranks, lambda: server.processes() + cell_processes(token), release

    def incidents(self):
        """The servers that ended before the session did, each once: the summary names them."""
        with self.lock:
            for pool in self.servers.values():
                self.ended += [s.exit for s in pool if s.exit is not None and s.exit not in self.ended]
            return list(self.ended)

    def close(self):
        for pool in self.servers.values():
            for server in pool:
                server.close()
        self.servers.clear()
