"""``pipefill local`` starts its launcher before its own imports (pipefill/local/early.py): the run takes that one
where its environment is the run's, its output lands in the run's ``launcher.log``, and a command that ends before
its run leaves no launcher and no temporary log behind."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from processes import alive, with_marker
from waiting import wait_for

from pipefill.local import early
from pipefill.local.launcher import Launcher
from pipefill.local.procs import preloaded_launcher


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the early launcher's temporary log goes: this test's own directory."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def test_the_run_takes_the_early_launcher_and_keeps_its_output(tmp_path: Path, spool_dir: Path) -> None:
    early.start()
    started = early._started
    assert started is not None and len(list(spool_dir.glob("pipefill-launcher-*.log"))) == 1
    log = tmp_path / "out" / "launcher.log"
    taken = preloaded_launcher(log)  # what the runner calls
    assert taken is started and early._started is None
    # on one file system the temporary log becomes the run's at once: a run killed now leaves nothing in the temp dir
    assert log.is_file() and not list(spool_dir.iterdir())
    assert taken.ready()
    taken.close()
    assert log.is_file(), "the run's launcher.log"


def test_an_early_launcher_of_another_environment_is_ended_and_a_new_one_started(
    tmp_path: Path, spool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early.start()
    started = early._started
    assert started is not None
    monkeypatch.setenv("PYTHONHASHSEED", "7")  # a start-up variable the children would see and the launcher not
    taken = preloaded_launcher(tmp_path / "launcher.log")
    try:
        assert taken is not None and taken is not started and taken.environ["PYTHONHASHSEED"] == "7"
        wait_for(lambda: not alive(started._proc.pid), "the early launcher ended", 10)
    finally:
        if taken is not None:
            taken.close(kill=True)
    assert not list(spool_dir.iterdir())


def test_a_command_that_ends_before_its_run_leaves_no_launcher_behind(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: pipefill.io/v1alpha1\nkind: PipelineTrainingJob\nmetadata: {name: x}\nspec: {}\n")
    marker = f"TMPDIR={tmp}".encode()
    done = subprocess.run(
        [sys.executable, "-m", "pipefill", "local", "-f", str(bad), "--out", str(tmp_path / "out")],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "spec" in done.stderr, done.stderr  # refused, naming the field

    assert not with_marker(marker), "a launcher outlived its command"
    assert not list(tmp.iterdir()), "the temporary log was left behind"


def test_a_log_on_another_file_system_is_copied_to_the_run_at_close(tmp_path: Path) -> None:
    """/tmp is often a tmpfs and the run's directory not: the temporary log cannot be moved, so it is copied."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's directory")
    spool = Path(tempfile.mkstemp(prefix="pipefill-launcher-", suffix=".log", dir=shm)[1])
    launcher = Launcher(dict(os.environ), spool, preload=("no_such_module_to_preload",))
    log = tmp_path / "out" / "launcher.log"
    launcher.move_log(log)
    assert spool.is_file() and not log.exists(), "moved across file systems?"
    assert launcher.ready()  # the missing module is skipped: nothing to share of it
    launcher.close()
    assert log.is_file() and not spool.exists() and launcher.log == log
