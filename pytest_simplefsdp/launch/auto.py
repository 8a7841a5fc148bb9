"""The ``auto`` launcher, the default: per cell, the fastest launcher shown equivalent to the reference
(torchrun) on that cell's device. On CPU that is ``fork``: the same verdicts, failing ranks and bitwise the
same losses and gradient norms as torchrun on real cells of both models and on the fault fakes
(tests/test_e2e_titan.py, tests/test_fork.py; benchmarks/launchers.py measures it). On GPUs fork has not
been shown equivalent yet, so GPU cells keep torchrun."""

from __future__ import annotations

from .fork import ForkLauncher
from .torchrun import TorchrunLauncher

CHOICE = {"cpu": ForkLauncher}  # device -> launcher class; any other device: torchrun


class AutoLauncher:
    name = "auto"
    remote = False

    def __init__(self):
        self.made = {}  # launcher class -> its one instance (a fork launcher keeps its servers)

    def resolve(self, device) -> object:
        """The launcher that runs a cell on ``device``."""
        kind = CHOICE.get(str(device), TorchrunLauncher)
        if kind not in self.made:
            self.made[kind] = kind()
        return self.made[kind]

    def reproducer(self, spec):
        return self.resolve(spec.device).reproducer(spec)

    def launch(self, spec):
        return self.resolve(spec.device).launch(spec)

    def incidents(self):
        return [line for launcher in self.made.values() for line in getattr(launcher, "incidents", list)()]

    def close(self):
        for launcher in self.made.values():
            launcher.close()
