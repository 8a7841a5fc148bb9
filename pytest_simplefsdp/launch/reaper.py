"""What every launcher puts between a rank and the process that started it: ``python -S .../reaper.py
--rank ARGV...`` (local, torchrun: one per rank; the fork server's ranks do the same in-process, and a SLURM step
runs one more around its torchrun, where the runner cannot reach).

The rule it enforces, the same under every launcher: a process a rank started that is still alive when that rank
has ended is a leftover. The reaper becomes the child subreaper, so such a process comes back to it even after it
left its session and dropped its environment (setsid, double fork, exec with an empty environment); when the
rank ends, everything still below the reaper is named on stdout (``simplefsdp-survivor pid N (cmd)``, which
lands in the rank's log, where the supervisor reads it and fails a green cell as infra) and killed.

With ``--rank`` the reaper leaves as the rank did: the same exit code, or the same signal raised on itself, so
the launcher sees exactly what it would see without it. Standard library only, started with ``-S`` (no site, no
sitecustomize: nothing of the target's or the shim's runs here), Linux's /proc for the process tree.
"""

import faulthandler
import os
import signal
import subprocess
import sys
import time

SURVIVOR_LINE = "simplefsdp-survivor"


def subreaper():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER (Linux)
    except (OSError, AttributeError):
        pass


def descendants(root=None):
    """Pids of every live process below ``root`` (this one), from /proc (no third-party modules here)."""
    root = root or os.getpid()
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
                fields = stat[stat.rindex(")") + 2 :].split()
                if fields[0] != "Z":
                    parents.setdefault(int(fields[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        for pid in parents.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = []
    return f"pid {pid} ({' '.join(words[:4])})"


def _reap():
    """Wait for every child that has ended (orphans come back to a subreaper as its children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(grace=2.0):
    """Name and kill every process still below this one; returns the lines to print."""
    found = descendants()
    lines = [f"{SURVIVOR_LINE} {describe(pid)}" for pid in found]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in found:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        while time.monotonic() < end:
            _reap()
            found = descendants()
            if not found:
                return lines
            time.sleep(0.05)
    return lines


def _die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv):
    faulthandler.disable()  # PYTHONFAULTHANDLER is for the rank: a re-raised signal must not dump this stack
    as_rank = argv[:1] == ["--rank"]
    argv = argv[1:] if as_rank else argv
    subreaper()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the stack-dump signal is for the rank
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent if as_rank else None)
    except OSError as e:  # (the launchers check this before they start a reaper: a race, or a SLURM node's view)
        print(f"cannot start {argv[0]!r}: {e.strerror or e}", file=sys.stderr, flush=True)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):  # a stop reaches the rank (or the step's torchrun)
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    for line in sweep():
        print(line, flush=True)
    if as_rank and code < 0:  # leave as the rank did: its signal, raised on this process
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: not caught anyway
            pass
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code if code >= 0 else 128 - code


def reaped(argv, python=None):
    """``argv`` run under a per-rank reaper (by path, with ``-S``: see the module's docstring)."""
    return [python or sys.executable, "-S", os.path.abspath(__file__), "--rank", *argv]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
