"""On a SLURM node, between the step's task and its torchrun (``python -m pytest_simplefsdp.launch.reaper
torchrun ...``): the runner's guarantee that nothing outlives a cell, where the runner cannot reach.

It becomes the child subreaper, so a rank's process that leaves its session and environment (setsid,
double fork, exec with an empty environment) comes back to it instead of init, where no SLURM
process tracking but cgroups would find it. When torchrun ends, everything still below the reaper is
named on stdout (``simplefsdp-survivor pid N (cmd)``: the launcher reads it from the step's log and
fails a green cell for it, as the local sweep does) and killed; the reaper exits with torchrun's code.
"""

import ctypes
import signal
import subprocess
import sys

import psutil

from .procs import kill_procs

SURVIVOR_LINE = "simplefsdp-survivor"


def sweep(grace=2.0):
    """Name and kill every process still below this one; returns the lines to print."""
    return [f"{SURVIVOR_LINE} {line}" for line in kill_procs(psutil.Process().children(recursive=True), grace)]


def main(argv):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER (Linux)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the stack-dump signal is for the ranks
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):  # a stop of the step reaches torchrun, which stops its ranks
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    for line in sweep():
        print(line, flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
