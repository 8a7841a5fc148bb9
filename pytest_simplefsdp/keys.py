"""What the session keeps on pytest's ``config.stash`` (explicit wiring, as pytest's own plugins keep theirs): a
leaf module, so the thin plugin and the session's modules name the same key without importing each other."""

from __future__ import annotations

import pytest

CONTROLLER = pytest.StashKey[object]()  # session.controller.Controller, under --simplefsdp-matrix
