"""The pytest plugin, thin as pytest-xdist's: it declares the options, the markers and our own hooks, and under
--simplefsdp-matrix (or ini ``simplefsdp_matrix = true``) loads the controller, which does the rest. Every pytest
run in an environment with the plugin installed imports this module, so it imports nothing else of the package
at its top: a plain run pays for the options and the ``simplefsdp_cell`` fixture only.

Pipeline, one subpackage per step: spec (matrix, cells, profiles) -> targets -> launch -> judge (results,
evidence, numerics, invariants, verdict) -> store -> report; run/ drives one cell, session/ the pytest session.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .keys import CONTROLLER
from .options import OPTIONS, add_options, raw

BUILTINS_PLUGIN = "simplefsdp-builtins"
SESSION_PLUGIN = "simplefsdp-session"
MATRIX = next(o for o in OPTIONS if o.name == "matrix")
MARKERS = (
    "simplefsdp: a cell of the SimpleFSDP composability matrix",
    "smoke: the small tier of matrix cells that CI runs (pytest -m smoke)",
    "simplefsdp_cell(cell_id, matrix=PATH or profile=NAME, mutant=None): the matrix cell the simplefsdp_cell "
    "fixture runs for this test",
)


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    add_options(parser, OPTIONS)


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if raw(config, MATRIX):  # (the other options are validated by the controller: a plain run reads none of them)
        from .session.controller import Controller  # the controller and its dependencies: matrix runs only

        register_builtins(config)
        config.stash[CONTROLLER] = controller = Controller(config)  # (read back from the stash, never by name)
        config.pluginmanager.register(controller, SESSION_PLUGIN)  # its hooks
        signal.signal(signal.SIGTERM, _terminate)
    else:
        from .options import check_unused

        check_unused(config)  # a --simplefsdp-* option that would do nothing without --simplefsdp-matrix


def register_builtins(config):
    """The built-in targets and launchers, as implementations of our own hooks (asked last, so a conftest's or
    another plugin's answer comes first). SLURM's is in launch/slurm_plugin.py, a plugin of its own."""
    if not config.pluginmanager.has_plugin(BUILTINS_PLUGIN):
        from .launch.procs import become_subreaper
        from .session.builtins import Builtins

        config.pluginmanager.register(Builtins(), BUILTINS_PLUGIN)
        become_subreaper()  # orphans that shed the cell's marker come back to us (see launch.procs)


def _terminate(signum, frame):
    """SIGTERM acts like Ctrl-C: the running cell's ranks are killed, finished results are kept."""
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A known failure that passed, outside gate mode: the standard XPASS outcome. The cell's records ride
    on its call report (plain data: pytest-xdist carries them from a worker to the controller)."""
    rep = yield
    reason = getattr(item, "xpass_reason", None)
    if reason and call.when == "call" and rep.passed:
        rep.wasxfail = reason
    controller = item.config.stash.get(CONTROLLER, None)
    if call.when == "call" and controller is not None and hasattr(item, "cell"):
        rep.simplefsdp_records = controller.session.store.take_pending()
    return rep


# --- the fixture API: one cell inside an ordinary test ------------------------------------------


@pytest.fixture
def simplefsdp_cell(request):
    """Runs the cell that the test's ``simplefsdp_cell`` marker names, as the matrix runs it (same
    launcher, timeout, clean-up, artifacts, evidence, numerics and known failures, from the
    --simplefsdp-* options), and returns its judged CellResult (status, failure_class, error_line,
    losses, grad_norms, evidence, numerics, log_dir; under ``mutant=``, mutation and killed_by)::

        @pytest.mark.simplefsdp_cell("deepseek_v3-dp2-ep2-eager", profile="cpu")
        def test_ep_trains(simplefsdp_cell):
            assert simplefsdp_cell.status == "passed"
    """
    from .session.state import MatrixSession
    from .spec.profiles import shipped
    from .yamlio import MatrixError

    marker = request.node.get_closest_marker("simplefsdp_cell")
    if marker is None or len(marker.args) != 1:
        raise pytest.UsageError(
            f"{request.node.nodeid}: the simplefsdp_cell fixture needs "
            f"@pytest.mark.simplefsdp_cell(cell_id, matrix=PATH or profile=NAME)"
        )
    matrix, profile = marker.kwargs.get("matrix"), marker.kwargs.get("profile")
    if (matrix is None) == (profile is None):
        raise pytest.UsageError(f"{request.node.nodeid}: simplefsdp_cell: give matrix=PATH or profile=NAME")
    if profile is not None and profile not in shipped(request.config.rootpath):
        raise pytest.UsageError(
            f"{request.node.nodeid}: simplefsdp_cell: unknown profile {profile!r}; known: "
            f"{', '.join(shipped(request.config.rootpath))}"
        )
    path = Path(matrix) if matrix else shipped(request.config.rootpath)[profile]
    path = path if path.is_absolute() else request.path.parent / path
    sessions = request.config.stash.setdefault(_FIXTURE_SESSIONS, {})
    if path not in sessions:  # one per matrix file for the whole pytest session, closed at its end
        register_builtins(request.config)
        if not path.exists():
            raise pytest.UsageError(f"simplefsdp_cell: {path}: no such matrix file")
        try:
            sessions[path] = state = MatrixSession(request.config, files=[path])
        except MatrixError as e:
            raise pytest.UsageError(str(e)) from None
        request.config.add_cleanup(state.store.close)
        request.config.add_cleanup(state.close)  # (a fixture's session has no summary: its incidents ride on no report)
    return sessions[path].run_one(path, marker.args[0], marker.kwargs.get("mutant"))


_FIXTURE_SESSIONS = pytest.StashKey[dict]()
