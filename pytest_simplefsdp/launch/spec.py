"""The records between a runner and a launcher: what to launch (LaunchSpec) and what happened (LaunchOutcome)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..commands import RankCommand


@dataclass
class LaunchSpec:
    cell_id: str
    command: RankCommand
    nproc: int
    log_dir: Path
    timeout: float
    port: int
    log_limit_bytes: int = 512 * 2**20
    first_rank: int = 0  # ranks first_rank .. first_rank+nproc-1 run here (the trace tier runs one)
    device: str = "cpu"  # the profile's device (a scheduler asks for GPUs for cuda cells)


@dataclass
class LaunchOutcome:
    exit_codes: dict[int | str, int] = field(default_factory=dict)  # rank (or the launcher's own process) -> exit
    # code (negative: signal)
    launcher_exit: int | None = None  # a launcher process's own failure (torchrun, srun) no rank explains
    first_failed_rank: int | None = None
    left: dict = field(default_factory=dict)  # rank -> (seconds after the start, exit code or None): when it ended
    timed_out: bool = False
    stuck_ranks: list = field(default_factory=list)
    log_flood: int = 0  # the log limit in bytes that the cell's output passed
    cut_logs: list = field(default_factory=list)  # the logs cut after a flood (whose ranks wrote past the limit)
    wall: float = 0.0
    rank_logs: dict = field(default_factory=dict)  # rank -> [paths]
    launcher_log: Path | None = None
    survivors: list = field(default_factory=list)  # descriptions of processes killed after a clean end
    reproducer: str = ""
    launch_error: str | None = None
    port: int | None = None
    notes: list = field(default_factory=list)
    launcher: str = ""  # the launcher that ran it (the cell's record says so)
