"""The pytest plugin, thin as pytest-xdist's: it declares the options and our own hooks, registers the
built-in targets and launchers as hook implementations, and under --simplefsdp-matrix (or ini
``simplefsdp_matrix = true``) registers the controller, which does the rest. Without the flag it adds
nothing to a run but the ``simplefsdp_cell`` fixture.

Pipeline, one module per step: matrix -> cells -> launch -> results -> verdict -> numerics (baselines)
-> report; controller.py drives it, items.py collects it, store.py keeps its records.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .controller import Controller
from .items import SESSION_PLUGIN, CellItem, controller_of
from .launch import LAUNCHERS, become_subreaper
from .matrix import MatrixError
from .options import OPTIONS, add_options, raw
from .profiles import MATRIX_DIR
from .targets import make_target

BUILTINS_PLUGIN = "simplefsdp-builtins"
MATRIX = next(o for o in OPTIONS if o.name == "matrix")


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    add_options(parser, OPTIONS)


def pytest_configure(config):
    config.addinivalue_line("markers", "simplefsdp: a cell of the SimpleFSDP composability matrix")
    config.addinivalue_line("markers", "smoke: the small tier of matrix cells that CI runs (pytest -m smoke)")
    config.addinivalue_line("markers", "simplefsdp_cell(cell_id, matrix=PATH or profile=NAME, mutant=None): the "
                                       "matrix cell the simplefsdp_cell fixture runs for this test")
    if raw(config, MATRIX):  # (the other options are validated by the controller: a plain run reads none of them)
        _register_builtins(config)
        config.pluginmanager.register(Controller(config), SESSION_PLUGIN)
        signal.signal(signal.SIGTERM, _terminate)


def _register_builtins(config):
    if not config.pluginmanager.has_plugin(BUILTINS_PLUGIN):
        config.pluginmanager.register(Builtins(), BUILTINS_PLUGIN)
        become_subreaper()  # orphans that shed the cell's marker come back to us (see launch.procs)


def _terminate(signum, frame):
    """SIGTERM acts like Ctrl-C: the running cell's ranks are killed, finished results are kept."""
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


class Builtins:
    """The built-in targets and launchers, as implementations of our own hooks (asked last, so a
    conftest's or another plugin's answer comes first). SLURM's is in launch/slurm.py, a plugin of its own."""

    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_target(self, matrix, cache_dir):
        return make_target(matrix, cache_dir)

    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_launcher(self, config, name, dry_run):
        return LAUNCHERS[name]() if name in LAUNCHERS else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A known failure that passed, outside gate mode: the standard XPASS outcome. The cell's records ride
    on its call report (plain data: pytest-xdist carries them from a worker to the controller)."""
    rep = yield
    reason = getattr(item, "xpass_reason", None)
    if reason and call.when == "call" and rep.passed:
        rep.wasxfail = reason
    if call.when == "call" and isinstance(item, CellItem):
        rep.simplefsdp_records = controller_of(item.config).store.take_pending()
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
    marker = request.node.get_closest_marker("simplefsdp_cell")
    if marker is None or len(marker.args) != 1:
        raise pytest.UsageError(f"{request.node.nodeid}: the simplefsdp_cell fixture needs "
                                f"@pytest.mark.simplefsdp_cell(cell_id, matrix=PATH or profile=NAME)")
    matrix, profile = marker.kwargs.get("matrix"), marker.kwargs.get("profile")
    if (matrix is None) == (profile is None):
        raise pytest.UsageError(f"{request.node.nodeid}: simplefsdp_cell: give matrix=PATH or profile=NAME")
    path = Path(matrix) if matrix else MATRIX_DIR / f"{profile}.yaml"
    path = path if path.is_absolute() else request.path.parent / path
    return _fixture_controller(request.config, path).run_one(path, marker.args[0], marker.kwargs.get("mutant"))


def _fixture_controller(config, path: Path) -> Controller:
    """One controller per matrix file for the whole pytest session (not registered as a plugin: the
    session's own tests are collected as usual), closed at its end."""
    controllers = config.stash.setdefault(_FIXTURE_CONTROLLERS, {})
    if path not in controllers:
        _register_builtins(config)
        if not path.exists():
            raise pytest.UsageError(f"simplefsdp_cell: {path}: no such matrix file")
        try:
            controllers[path] = Controller(config, files=[path])
        except MatrixError as e:
            raise pytest.UsageError(str(e)) from None
        config.add_cleanup(controllers[path].close)
    return controllers[path]


_FIXTURE_CONTROLLERS = pytest.StashKey[dict]()
