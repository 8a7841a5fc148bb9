"""Step 3: launch one cell's ranks, watch them, and leave no process behind.

Every launcher starts its root processes with ``procs.spawn`` and hands them to the one ``Supervisor``
(supervisor.py), which ends a cell at its first failure, its timeout or a log flood and kills what
outlived it. Built in:

* ``torchrun`` (torchrun.py) — the reference: exactly ``torchrun --nproc-per-node N ... -m torchtitan.train``.
* ``local`` (local.py) — the runner starts the N ranks itself with the environment torchrun gives them.
* ``fork`` (fork.py, forkserver.py) — a server imports torch and the target once and forks every cell's ranks.
* ``slurm`` (slurm.py) — one srun job step per cell; a plugin of its own with its own options (slurm_plugin.py).
* ``auto`` (auto.py), the default — per device the fastest one shown equivalent to torchrun: fork on CPU,
  torchrun on GPUs.

builtin.py names them. Nothing is imported here: every pytest run loads the SLURM plugin below this
package. A plugin adds another through the ``pytest_simplefsdp_make_launcher`` hook (see hookspecs.Launcher).
"""
