"""What a cell runs: a target turns a cell's axes into one rank's program (argv + env).

A matrix file names its target. Built in: ``titan03`` (torchtitan 0.3 graph_trainer, titan03.py), ``titan02``
(the seed era, titan02.py) and ``{command: [...]}`` (any program, command.py); what the torchtitan targets
share is in base.py, and flags.py spells their flags the way the installed torchtitan takes them. A plugin
adds another through the ``pytest_simplefsdp_make_target`` hook. Whatever differs between torchtitan
generations lives in a target class and its matrix files.
"""

from __future__ import annotations

from pathlib import Path

from ..commands import RankCommand
from ..spec.matrix import Matrix, MatrixError
from .base import TorchtitanTarget
from .command import CommandTarget
from .titan02 import Titan02
from .titan03 import Titan03

__all__ = ["TARGETS", "CommandTarget", "RankCommand", "Titan02", "Titan03", "TorchtitanTarget", "make_target"]

TARGETS = {Titan03.name: Titan03, Titan02.name: Titan02}


def make_target(matrix: Matrix, cache_dir: Path):
    """The matrix's target; ``cache_dir`` holds what it generates once (dataset, tokenizer)."""
    spec = matrix.target
    if isinstance(spec, dict):
        target = CommandTarget(matrix)
        target.check_steps()
        return target
    if spec not in TARGETS:
        raise MatrixError(
            f"{matrix.where('target')}: unknown target {spec!r}; built in: "
            f"{', '.join(TARGETS)}, or {{command: [...]}} (plugins add more: "
            f"pytest_simplefsdp_make_target)"
        )
    target = TARGETS[spec](matrix, cache_dir)
    target.check()
    target.check_steps()
    return target
