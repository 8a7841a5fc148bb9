"""The ``local`` launcher: the runner starts the N rank processes itself, with the environment torchrun
would give them. No torch import in the runner: it suits fast fake targets and 1-rank cells."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess

from .procs import (
    cell_token,
    check_runnable,
    die_with_parent,
    interpreter,
    kill_cell,
    quote_env,
    rank_env,
    spawn,
    worker_vars,
)
from .reaper import reaped
from .spec import LaunchOutcome, LaunchSpec
from .supervisor import Supervisor


class LocalLauncher:
    """Starts the ranks itself, with the environment torchrun would set."""

    name = "local"
    remote = False  # the ranks run on this host: its GPUs and rank budget apply

    def reproducer(self, spec: LaunchSpec):
        env = quote_env(spec.command.env)
        cd = f"cd {shlex.quote(spec.command.cwd)} && " if spec.command.cwd else ""
        virtual = spec.command.virtual_local_rank  # (each rank local rank 0 of its own GPU)
        ranks = " & ".join(
            f"RANK={spec.first_rank + r} LOCAL_RANK={0 if virtual else r}{f' CUDA_VISIBLE_DEVICES={r}' if virtual else ''} "
            f"WORLD_SIZE={spec.nproc} LOCAL_WORLD_SIZE={spec.nproc} "
            f"MASTER_ADDR=127.0.0.1 MASTER_PORT={spec.port} {env + ' ' if env else ''}{shlex.join(spec.command.argv)}"
            for r in range(spec.nproc)
        )
        return f"{cd}{ranks} & wait"

    def close(self):
        """Nothing outlives a cell of this launcher (its sweep ends every process)."""

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        token = cell_token(spec)
        out = LaunchOutcome(reproducer=self.reproducer(spec), port=spec.port, launcher=self.name)
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
        check_runnable(spec.command.argv, spec.command.cwd, base)
        procs, files = {}, []
        try:
            for r in range(spec.nproc):
                env = dict(base, **worker_vars(spec, r, base, token))
                log = spec.log_dir / f"rank{r}.log"
                out.rank_logs[r] = [log]
                f = open(log, "wb")
                files.append(f)
                procs[r] = spawn(
                    reaped(spec.command.argv, interpreter(spec.command.argv)),
                    env=env,
                    cwd=spec.command.cwd,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGKILL),
                )
        except OSError:
            for f in files:
                f.close()
            raise

        def close():
            for f in files:
                f.close()

        return procs, None, close
