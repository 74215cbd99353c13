"""The frame the benchmarks that run child commands share (``pipefill.bench.runs``): a failed or overrunning child
is a BenchError naming what failed, how, and its log, with the log's tail; the runs' root is removed afterwards
unless kept, also when a run failed; the failure is printed the benchmark's way and gives None."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from pipefill.bench.runs import BenchError, in_root, run_logged


def test_a_child_that_exits_non_zero_is_an_error_naming_it_its_exit_and_its_log(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    argv = [sys.executable, "-c", "import sys; print('the last words'); sys.exit(3)"]
    with pytest.raises(BenchError) as info:
        run_logged(argv, cwd=tmp_path, log=log, timeout_s=60, what="the child in here")
    assert str(info.value).startswith(f"the child in here exited 3 (its output: {log}):\n"), info.value
    assert "the last words" in str(info.value) and "the last words" in log.read_text()


def test_a_child_past_its_time_is_killed_and_an_error_naming_the_limit(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(BenchError, match=r"(?s)^the sleeper ran past --timeout-s 0\.5 \(its output: .*\(no output\)$"):
        run_logged(argv, cwd=tmp_path, log=tmp_path / "output.log", timeout_s=0.5, what="the sleeper")


def test_a_child_that_succeeds_leaves_its_output_in_the_log(tmp_path: Path) -> None:
    run_logged([sys.executable, "-c", "print('fine')"], cwd=tmp_path, log=tmp_path / "out.log", timeout_s=60, what="x")
    assert (tmp_path / "out.log").read_text() == "fine\n"


def test_a_temporary_root_is_removed_after_the_runs_and_after_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Path] = []

    def body(root: Path) -> int:
        seen.append(root)
        (root / "run0").mkdir()
        return 7

    def failing(root: Path) -> int:
        seen.append(root)
        raise BenchError(f"run in {root}: rank 1 exited 3")

    assert in_root("demo", None, body) == 7
    assert in_root("demo", None, failing) is None
    assert all(r.parent == Path(tempfile.gettempdir()) and r.name.startswith("pipefill-bench-demo-") for r in seen)
    assert not any(r.exists() for r in seen), seen
    assert capsys.readouterr().err == f"pipefill bench demo: run in {seen[1]}: rank 1 exited 3\n"


def test_a_kept_root_stays_and_a_json_benchmark_reports_its_failure_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(root: Path) -> None:
        (root / "run0").mkdir()
        raise BenchError("pipefill local (one) exited 1")

    assert in_root("fill-queue", tmp_path, failing, error_json=True) is None
    assert (tmp_path / "run0").is_dir()
    out = capsys.readouterr()
    assert json.loads(out.out) == {"benchmark": "fill-queue", "error": "pipefill local (one) exited 1"}
    assert out.err == ""
