"""The one supervisor every launcher uses: it waits for a cell's root processes, tears a cell down at
its first failure (SIGTERM, a short grace, then SIGKILL), dumps stacks and stops the cell at its
timeout, stops a log flood, and kills whatever outlived the cell: what each rank's reaper named in its log
(launch/reaper.py), then whatever still carries the cell's marker or came back to the runner."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil

from ..paths import probe_folder
from .procs import TERM_GRACE_S, cell_processes, kill_procs, orphans_since, runner_children
from .reaper import SURVIVOR_LINE

SURVIVOR = re.compile(rf"(?m)^{SURVIVOR_LINE} (pid \d+ \(.*\))$")
POLL_S = 0.05
RANKS_POLL_S = 0.5  # how often ranks below another process (torchrun's, a SLURM step's) are listed
STACK_DUMP_WAIT_S = 1.5


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
                self.outcome.cut_logs.append(str(path))
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
        before = {p.pid for p in runner_children()} | {p.pid for p in procs.values()}
        try:
            self._watch(procs, on_first_failure, alive_ranks, start)
        except BaseException:  # Ctrl-C / SIGTERM of the runner: leave nothing behind
            self.kill(grace=1.0)
            kill_procs(orphans_since(before), grace=0.5)
            raise
        self.outcome.wall = time.monotonic() - start
        self.outcome.survivors = self.reaped() + self.kill() + kill_procs(orphans_since(before), grace=0.5)

    def reaped(self):
        """What the ranks' reapers named and killed (launch/reaper.py): the lines they left in the cell's logs."""
        found = []
        for path in sorted(self.spec.log_dir.rglob("*.log")):
            try:
                with open(path, "rb") as f:
                    found += SURVIVOR.findall(f.read().decode(errors="replace"))
            except OSError:
                pass
        return found

    def deadline(self, start, now):
        """When the cell counts as hung (a scheduler's launcher starts the clock later)."""
        return start + self.spec.timeout

    def on_deadline(self, procs, alive_ranks):
        """The cell ran past its timeout: dump every rank's stack, note who was still running, stop it."""
        self.outcome.timed_out = True
        self.dump_stacks()
        self.outcome.stuck_ranks = sorted(
            alive_ranks() if alive_ranks else (k for k in procs if k not in self.outcome.exit_codes)
        )
        self.kill()

    def note_leavers(self, now, start, procs, alive_ranks):
        """When each rank ended (``outcome.left``): a rank that leaves while its peers run on is the cause when the
        cell then hangs. Ranks the launcher started as processes report their exit code; ranks below another
        process (torchrun's workers, a SLURM step's) are seen gone from ``alive_ranks``, their code unknown here."""
        left = self.outcome.left
        for key, code in self.outcome.exit_codes.items():
            if isinstance(key, int):
                left.setdefault(key, (round(now - start, 2), code))
        if alive_ranks is not None and now >= self._ranks_polled + RANKS_POLL_S:
            self._ranks_polled = now
            alive = set(alive_ranks())
            for rank in (self._seen | self.ended_ranks()) - alive:
                left.setdefault(rank, (round(now - start, 2), None))
            self._seen |= alive

    def ended_ranks(self) -> set:
        """Ranks whose process ended in order (the start-up shim's ``ended/`` markers): also those that left
        between two listings, never seen running."""
        return marked_ranks(self.spec.log_dir, "ended")

    def _watch(self, procs, on_first_failure, alive_ranks, start):
        self._listed, self._logs = -1e9, []
        self._seen, self._ranks_polled = set(), -1e9  # the ranks seen running (alive_ranks), when last asked
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
            if torn_down is None:  # (after a failure, who ends when is the tear-down's doing)
                self.note_leavers(now, start, procs, alive_ranks)
            if torn_down is not None and now > torn_down + TERM_GRACE_S:
                # a peer that ignores SIGTERM must not turn the first failure into a hang
                self.outcome.notes.append(
                    f"ranks still running {TERM_GRACE_S:.0f} s after rank "
                    f"{self.outcome.first_failed_rank} failed were killed (SIGKILL)"
                )
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


def marked_ranks(log_dir, state) -> set:
    """The ranks the start-up shim marks ``running`` (its process lives) or ``ended`` (it exited in order):
    ``<evidence>/<state>/rank<R>.pid<P>``."""
    return {int(p.name[4:].partition(".")[0]) for p in (probe_folder(log_dir) / state).glob("rank*")}
