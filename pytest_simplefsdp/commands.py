"""The record a target hands to a launcher: the program every rank of a cell runs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RankCommand:
    """The program every rank runs; the launcher adds RANK, WORLD_SIZE, MASTER_PORT, ..."""

    argv: list
    env: dict = field(default_factory=dict)
    cwd: str | None = None
    preload: list = field(default_factory=list)  # modules a fork server imports once (beyond argv's)
    virtual_local_rank: bool = False  # torchrun --virtual-local-rank: every worker LOCAL_RANK 0, its own GPU only
    unforkable: str | None = None  # why the fork launcher must not fork it (it runs under local instead)
    # the options this torchtitan does not have that the cell asks for (targets.flags.OptionError): not launched
    lacking: tuple = ()
