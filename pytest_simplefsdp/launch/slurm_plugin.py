"""The SLURM launcher as a pytest plugin of its own (entry point ``simplefsdp_slurm``): its options in the
plugin's group, and its launcher through ``pytest_simplefsdp_make_launcher``, the hook any plugin uses. Every pytest
run loads this module: the launcher itself (slurm.py) is imported only when ``--simplefsdp-launcher=slurm`` asks."""

from __future__ import annotations

import shlex

import pytest

from ..options import Option, add_options, positive, read, whole


def _srun_words(name, value):
    try:
        return shlex.split(value or "")
    except ValueError as e:
        raise pytest.UsageError(f"--simplefsdp-{name}: {e}: {value!r}") from None


OPTIONS = [
    Option(
        "slurm-partition",
        "string",
        None,
        "slurm launcher: the partition the cells' steps run in (srun --partition)",
        metavar="NAME",
    ),
    Option("slurm-account", "string", None, "slurm launcher: the account charged (srun --account)", metavar="NAME"),
    Option(
        "slurm-args",
        "string",
        None,
        'slurm launcher: more srun options, as one shell-quoted string (e.g. "--qos=high --cpus-per-task=16")',
        _srun_words,
        metavar="ARGS",
    ),
    Option(
        "slurm-ranks-per-node",
        "string",
        None,
        "slurm launcher: most ranks one node runs; larger cells span "
        "nodes (default: 8 for GPU profiles, one node for CPU profiles)",
        whole,
        metavar="N",
    ),
    Option(
        "slurm-queue-timeout",
        "string",
        "3600",
        "slurm launcher: seconds a cell may wait in SLURM's queue "
        "before it is withdrawn and reported as not scheduled (its "
        "--simplefsdp-timeout counts from the step's start)",
        positive,
        metavar="SECONDS",
    ),
]


def pytest_addoption(parser):
    add_options(parser, OPTIONS)


@pytest.hookimpl(trylast=True)
def pytest_simplefsdp_make_launcher(config, name, dry_run):
    if name != "slurm":
        return None
    from .slurm import SlurmLauncher, SlurmOptions, check_cluster  # (only here: the plugin loads in every run)

    o = read(config, OPTIONS)
    options = SlurmOptions(
        o["slurm_partition"],
        o["slurm_account"],
        o["slurm_args"],
        o["slurm_ranks_per_node"],
        o["slurm_queue_timeout"] or 3600.0,
    )
    problem = None if dry_run else check_cluster(options)
    if problem:
        raise pytest.UsageError(problem)
    return SlurmLauncher(options)
