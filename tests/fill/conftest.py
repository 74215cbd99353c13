"""Fixtures of the fill executor's tests ; plain helpers live in fill_helpers.py, a module name no other test folder uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fill_helpers import STARTED


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


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    """What a test started and left running (it failed or timed out before its clean-up) is killed after it."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
