"""The launchers built in (``--simplefsdp-launcher``); SLURM's comes from its plugin (slurm_plugin.py)."""

from .auto import AutoLauncher
from .fork import ForkLauncher
from .local import LocalLauncher
from .torchrun import TorchrunLauncher

LAUNCHERS = {"auto": AutoLauncher, "torchrun": TorchrunLauncher, "local": LocalLauncher, "fork": ForkLauncher}
