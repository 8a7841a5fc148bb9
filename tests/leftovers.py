"""A test suite plugin (``-p leftovers``; tests/conftest.py loads it): a test that fails, times out
(pytest-timeout's signal method raises in the test) or is interrupted leaves no process of its own running.
pytester's ``runpytest_subprocess`` kills its child only on its own timeout; on any other exception the inner
pytest, with the cells it is running, would go on using the cores for the rest of the suite."""

import psutil
import pytest

from pytest_simplefsdp.launch.procs import kill_procs


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        return (yield)
    except BaseException:
        # what the test started and left behind (a fixture's processes were started before the call)
        new = [p for p in me.children(recursive=True) if p.pid not in before]
        if new:
            kill_procs(new, grace=2)
        raise
