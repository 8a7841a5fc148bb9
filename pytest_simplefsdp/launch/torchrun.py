"""The ``torchrun`` launcher, the reference: exactly ``torchrun --nproc-per-node N ... -m torchtitan.train``
as a user would type it; torchrun writes one log per rank and names the first failure."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from pathlib import Path

import psutil

from .procs import cell_processes, cell_token, die_with_parent, interpreter, python_module, quote_env, rank_env, spawn
from .reaper import reaped
from .spec import LaunchOutcome, LaunchSpec
from .supervisor import Supervisor


class TorchrunLauncher:
    """``torchrun`` with per-rank log files; the reference launcher."""

    name = "torchrun"
    remote = False

    def torchrun_argv(self, spec: LaunchSpec, nproc=None, addr="127.0.0.1", log_dir=None, nodes=()):
        """torchrun for the cell; ``nodes``: extra rendezvous options of a multi-node run."""
        argv = [
            interpreter(spec.command.argv),
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc or spec.nproc}",
            *nodes,
            f"--master-addr={addr}",
            f"--master-port={spec.port}",
            "--max-restarts=0",
            f"--log-dir={log_dir or spec.log_dir / 'torchrun'}",
            "--redirects=3",
            *(["--virtual-local-rank"] if spec.command.virtual_local_rank else []),
        ]
        # each worker under its own reaper (launch/reaper.py): what a rank leaves behind is named in its log
        return argv + ["--no-python", *reaped(spec.command.argv, interpreter(spec.command.argv))]

    def reproducer(self, spec: LaunchSpec):
        module = python_module(spec.command.argv)
        exe = Path(interpreter(spec.command.argv)).parent / "torchrun"  # the environment's own: runs from any shell
        head = f"{exe if exe.exists() else 'torchrun'} --nproc-per-node={spec.nproc} --master-port={spec.port}"
        head += " --virtual-local-rank" if spec.command.virtual_local_rank else ""
        body = f"-m {module[0]} {shlex.join(module[1])}" if module else f"--no-python {shlex.join(spec.command.argv)}"
        cd = f"cd {shlex.quote(spec.command.cwd)} && " if spec.command.cwd else ""
        return f"{cd}{quote_env(spec.command.env)} {head} {body}".strip()

    def close(self):
        """Nothing outlives a cell of this launcher (its sweep ends every process)."""

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        token = cell_token(spec)
        out = LaunchOutcome(reproducer=self.reproducer(spec), port=spec.port, launcher=self.name)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        out.launcher_log = spec.log_dir / "torchrun.log"
        with open(out.launcher_log, "wb") as f:
            try:
                proc = spawn(
                    self.torchrun_argv(spec),
                    env=rank_env(spec, token),
                    cwd=spec.command.cwd,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGTERM),
                )  # torchrun stops its workers
            except OSError as e:
                out.launch_error = f"cannot start torchrun: {e.strerror or e}"
                return out
            Supervisor(spec, token, out).run({"torchrun": proc}, alive_ranks=lambda: self._ranks_of(proc, token))
        code = out.exit_codes.pop("torchrun", None)
        for r in range(spec.nproc):
            out.rank_logs[r] = sorted((spec.log_dir / "torchrun").glob(f"*/attempt_*/{r}/std*.log"))
        read_root_cause(out, code)
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


def read_root_cause(out: LaunchOutcome, code):
    """torchrun's summary: every failed rank's exit code or signal, and the rank it names as the first failure.
    torchrun orders failures by time stamps of two kinds (a rank's error file when it wrote one, else when torchrun
    saw it gone), so a peer that raised "connection closed" at a killed rank's hang-up can be named before the rank
    killed: when the supervisor saw another failed rank leave strictly earlier, that rank is the first failure."""
    text = out.launcher_log.read_text(errors="replace") if out.launcher_log else ""
    head = "Root Cause (first observed failure)"
    if head in text:
        end = text.rfind(head)
        start = text.rfind("Failures:", 0, end)  # (the last summary, with the other failures it lists)
        summary = text[start if start >= 0 else end :]
        codes: dict = {}
        for block in re.split(r"(?m)^\s*\[\d+\]:\s*$", summary)[1:]:
            rank = re.search(r"(?m)^\s*rank\s*:\s*(\d+)", block)
            exitcode = re.search(r"(?m)^\s*exitcode\s*:\s*(-?\d+)", block)
            if rank and exitcode:
                codes.setdefault(int(rank.group(1)), int(exitcode.group(1)))
        named = re.search(r"(?m)^\s*rank\s*:\s*(\d+)", text[end:])  # the root cause's block
        if named is not None:
            first = int(named.group(1))
            left = {r: out.left[r][0] for r, c in codes.items() if c != 0 and r in out.left}
            earliest = min(left, key=lambda r: left[r], default=first)
            if first in left and left[earliest] < left[first]:
                out.notes.append(
                    f"torchrun named rank {first} as the first failure; rank {earliest} left "
                    f"{left[first] - left[earliest]:.1f} s before it"
                )
                first = earliest
            out.first_failed_rank = first
            out.exit_codes.update(codes)
    if code not in (0, None) and out.first_failed_rank is None and not out.timed_out:
        out.launcher_exit = code
