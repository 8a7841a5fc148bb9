"""The built-in targets and launchers, as implementations of our own hooks, registered ``trylast`` so that a
conftest's or another plugin's answer comes first (as pytest-xdist's own scheduler is)."""

from __future__ import annotations

import pytest

from ..launch.builtin import LAUNCHERS
from ..targets import make_target


class Builtins:
    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_target(self, matrix, cache_dir):
        return make_target(matrix, cache_dir)

    @pytest.hookimpl(trylast=True)
    def pytest_simplefsdp_make_launcher(self, config, name, dry_run):
        return LAUNCHERS[name]() if name in LAUNCHERS else None
