"""Step 3: launch one cell's ranks, watch them, and leave no process behind.

Every launcher starts its root processes with ``procs.spawn`` and hands them to the one ``Supervisor``
(supervisor.py), which ends a cell at its first failure, its timeout or a log flood and kills what
outlived it. Built in:

* ``torchrun`` (torchrun.py) — the reference: exactly ``torchrun --nproc-per-node N ... -m torchtitan.train``.
* ``local`` (local.py) — the runner starts the N ranks itself with the environment torchrun gives them.
* ``fork`` (fork.py, forkserver.py) — a server imports torch and the target once and forks every cell's ranks.
* ``slurm`` (slurm.py) — one srun job step per cell; a plugin of its own with its own options.
* ``auto`` (auto.py), the default — per device the fastest one shown equivalent to torchrun: fork on CPU,
  torchrun on GPUs.

A plugin adds another through the ``pytest_simplefsdp_make_launcher`` hook (see hookspecs.Launcher).
"""

from .auto import AutoLauncher
from .fork import ForkLauncher
from .local import LocalLauncher
from .procs import (MARKER, SESSION, become_subreaper, cell_processes, cell_token, die_with_parent, free_port,
                    kill_cell, kill_procs, orphans_since, quote_env, rank_env, rank_vars, session_leftovers, spawn)
from .supervisor import LaunchOutcome, LaunchSpec, Supervisor
from .torchrun import TorchrunLauncher

# slurm: a plugin of its own
LAUNCHERS = {"auto": AutoLauncher, "torchrun": TorchrunLauncher, "local": LocalLauncher, "fork": ForkLauncher}

__all__ = ["LAUNCHERS", "MARKER", "SESSION", "AutoLauncher", "ForkLauncher", "LaunchOutcome", "LaunchSpec",
           "LocalLauncher", "Supervisor", "TorchrunLauncher", "become_subreaper", "cell_processes", "cell_token",
           "die_with_parent", "free_port", "kill_cell", "kill_procs", "orphans_since", "quote_env", "rank_env", "rank_vars",
           "session_leftovers", "spawn"]
