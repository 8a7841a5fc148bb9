"""A pytest plugin for benchmarks/ci_budget.py: each test's wall (setup, call and teardown) and the CPU it and its
children used meanwhile, with its markers and fixtures, one JSON line per test in $SIMPLEFSDP_CI_BUDGET_OUT/<pid>.jsonl
(each xdist worker writes its own file; tox passes SIMPLEFSDP_*). tests/conftest.py registers it where that is set;
it records, it asserts nothing.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("SIMPLEFSDP_CI_BUDGET_OUT")
    start, cpu = time.monotonic(), _cpu()
    yield
    if not out:
        return
    record = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - start, 2),
        "cpu": round(_cpu() - cpu, 2),  # (children count once they are waited for: ranks, builds, subprocesses)
        "markers": sorted({m.name for m in item.iter_markers()}),
        "fixtures": sorted(getattr(item, "fixturenames", ())),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "env": os.environ.get("TOX_ENV_NAME", ""),  # (tiers run side by side write to one folder)
    }
    with open(Path(out) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
