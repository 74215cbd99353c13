"""Fixtures of the fill executor's tests ; plain helpers live in fill_helpers.py, a module name no other test folder uses."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "jobs"
    d.mkdir()
    return d
