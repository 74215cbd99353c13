"""Fixtures of the fill executor's tests ; plain helpers live in fill_helpers.py, a module name no other test folder uses."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "jobs"
    d.mkdir()
    return d


@pytest.fixture(autouse=True)
def profile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own profile cache (the executors' default is shared by every job of the machine)."""
    d = tmp_path / "profile-cache"
    monkeypatch.setenv("PIPEFILL_FILL_PROFILE_DIR", str(d))
    return d
