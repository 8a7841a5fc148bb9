"""The plugin's own hooks: a conftest or another plugin extends the matrix through them.

Added with ``pytest_addhooks``, as pytest-xdist adds its ``newhooks``. The built-in targets and launchers
are implementations too (``session.builtins.Builtins`` and the SLURM plugin ``launch.slurm_plugin``, both ``trylast``), so a
conftest's is asked first:

    # conftest.py
    from pytest_simplefsdp.targets import CommandTarget

    class Mine(CommandTarget):
        name = "mine"

    def pytest_simplefsdp_make_target(matrix, cache_dir):
        if matrix.target == "mine":
            return Mine(matrix)

``Target`` and ``Launcher`` say what the plugin calls on the objects these hooks return.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import pytest


class Target(Protocol):
    """What a cell runs. Built in: targets.Titan03, Titan02, CommandTarget (on targets.base.Target, which
    fills every member below; a plugin's target usually subclasses one of them). Every member the rest of the
    package reads on a target is listed here (tests/test_layout.py fails on one that is not)."""

    name: str
    spelling: str  # how flags were spelled, for the header
    MUTANTS: tuple  # judge.mutants.Mutant the target can re-inject
    REQUIRES: tuple  # what a version set's environment installs beyond its pins (titan03: torch, torchtitan, triton)
    SUPPORTS: dict  # package -> the version range it runs against ({}: any); a set outside it is marked
    PROVES: tuple  # the packages every rank records it imported (optional: none)
    LOADED: str  # what a rank's log says once it loaded a checkpoint (the feature's later runs)
    python_for: object  # set by the session: version set label -> the Python of its environment

    def check_installed(self) -> str | None: ...  # why it cannot run here, or None
    def bind(self, cells) -> dict: ...  # last checks against what is installed; the cells not offered here -> why
    def prepare(self) -> None: ...  # make what every cell needs (assets), once
    def command(self, cell, dump_folder: Path, **kwargs): ...  # -> targets.RankCommand
    def evidence_plan(self, cell) -> list: ...  # [evidence.Expect]
    def evidence_lines(self, cell) -> list: ...  # what the evidence checks, a line each (the dry run's)
    def evidence(self, cell, log_dir: Path) -> list: ...  # [evidence.Evidence]
    def memory(self, cell, log_dir: Path): ...  # judge.layout.Memory | None
    def baseline_axes(self, axes: dict) -> dict: ...
    def losses(self, dump_folder: Path) -> dict: ...  # step -> loss at full precision ({}: the log's)
    # -> RankCommand of the seed checkpoint, or None; ``versions``: the label of the version set it runs on
    def seed_command(self, model: str, folder: Path, versions: str = "installed"): ...
    def outside_range(self, versions: dict) -> list: ...  # what of a version set lies outside SUPPORTS, a line each
    def path_rules(self) -> list: ...  # --simplefsdp-changed: spec.paths.PathRule of its torchtitan paths
    def runs(self, cell) -> int: ...  # how many runs the cell's feature makes (a resume: 2)
    def before_steps(self, cell) -> list: ...  # the steps one process runs before the cell (e.g. precompile)
    def step_command(self, cell, step: str, dump_folder: Path, seed_folder: Path | None = None): ...
    def loaded_checkpoint(self, log_text: str) -> bool: ...  # a later run's rank 0 log shows it loaded one


class Launcher(Protocol):
    """How a cell's ranks start. Built in: launch.TorchrunLauncher, LocalLauncher, ForkLauncher, AutoLauncher (the
    default: picks one per device, ``resolve(device)``); launch.slurm's SlurmLauncher. Each gives its root processes
    to launch.Supervisor (see launch/__init__.py)."""

    name: str
    remote: bool  # the ranks run elsewhere: this host's GPUs and rank budget do not apply

    def reproducer(self, spec) -> str: ...  # one shell line that reruns the cell alone
    def launch(self, spec): ...  # launch.LaunchSpec -> launch.LaunchOutcome
    def close(self) -> None: ...  # end of session: must not raise when what it started is already gone

    # optional: def incidents(self) -> list[str]: what went wrong in the launcher itself during the run (a fork
    # server that ended), named in the summary and the JSON; a launcher without it has none to report


@pytest.hookspec(firstresult=True)
def pytest_simplefsdp_make_target(matrix, cache_dir) -> Target | None:
    """The Target for ``matrix`` (``matrix.target``: the name or mapping in its file), or None to pass.
    Raise matrix.MatrixError for a target that is yours but misconfigured."""


@pytest.hookspec(firstresult=True)
def pytest_simplefsdp_make_launcher(config, name, dry_run) -> Launcher | None:
    """The Launcher ``--simplefsdp-launcher=name`` asks for, or None to pass (raise pytest.UsageError for
    bad options of yours)."""


def pytest_simplefsdp_modify_cells(config, matrix, cells, dropped):
    """After expansion, before collection: change ``cells`` (cells.Cell) in place; a cell moved to
    ``dropped`` (cells.Dropped, with a rule name and reason) shows as n/a. Called for every matrix the
    session loads, the shipped profiles too (known-failure entries are checked against them)."""


def pytest_simplefsdp_cell_result(config, record):
    """Each record of the run (``record["type"]``: cell or baseline), as the controller receives it."""


def pytest_simplefsdp_report(config, doc):
    """At the end of the session, the run's document (what --simplefsdp-json writes): another format."""
