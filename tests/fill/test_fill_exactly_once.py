"""Exactly-once progress: recovery rules of the store, and SIGKILL at random points in real processes."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fill_helpers import start_drive, write_job

from pipefill_fill.store import ProgressStore, read_outputs


def _store(tmp_path: Path, *, outputs: bool = True) -> ProgressStore:
    store = ProgressStore(tmp_path / "out", job="j", with_outputs=outputs)
    assert store.recover().end == 0
    return store


def _emit(store: ProgressStore, start: int, end: int) -> None:
    store.add(np.arange(start, end), np.arange(start, end, dtype=np.float32)[:, None].repeat(3, 1))


def _commit_runs(store: ProgressStore, *ends: int) -> None:
    """Emit and commit the samples up to each of ``ends`` in turn, from the committed pointer; each commit's state is
    ``{"next": end}``."""
    for end in ends:
        _emit(store, store.committed, end)
        store.commit(end=end, state={"next": end})


def test_commit_then_recover(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit_runs(store, 5, 9)
    _emit(store, 9, 12)  # never committed: lost with the process, redone after restart
    again = ProgressStore(tmp_path / "out", job="j", with_outputs=True).recover()
    assert (again.end, again.state) == (9, {"next": 9})
    rows = read_outputs(tmp_path / "out")
    assert rows["sample_id"].tolist() == list(range(9)) and rows["value"][:, 0].tolist() == list(range(9))


def test_recover_adopts_a_complete_chunk_and_removes_orphans(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit_runs(store, 4)
    progress = (tmp_path / "out" / "progress.json").read_bytes()
    _commit_runs(store, 8)
    (tmp_path / "out" / "progress.json").write_bytes(progress)  # crash between the chunk and the pointer
    (tmp_path / "out" / "checkpoints" / "state-000000000012.pt").write_bytes(b"x")  # crash before its chunk
    (tmp_path / "out" / "chunks" / ".chunk-000000000008-000000000012.npy.1.tmp").write_bytes(b"torn")
    got = ProgressStore(tmp_path / "out", job="j", with_outputs=True).recover()
    assert (got.end, got.state, got.adopted, got.removed) == (8, {"next": 8}, 1, 2)
    assert sorted(p.name for p in (tmp_path / "out" / "chunks").iterdir()) == [
        "chunk-000000000000-000000000004.npy",
        "chunk-000000000004-000000000008.npy",
    ]


def test_recover_removes_a_chunk_whose_state_is_missing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit_runs(store, 4)
    rows = np.load(tmp_path / "out" / "chunks" / "chunk-000000000000-000000000004.npy")
    np.save(tmp_path / "out" / "chunks" / "chunk-000000000004-000000000006.npy", rows[:2])
    got = ProgressStore(tmp_path / "out", job="j", with_outputs=True).recover()
    assert (got.end, got.removed) == (4, 1)


def test_recover_refuses_a_gap(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit_runs(store, 4, 6)
    (tmp_path / "out" / "chunks" / "chunk-000000000000-000000000004.npy").unlink()
    with pytest.raises(RuntimeError, match="does not continue at sample 0"):
        ProgressStore(tmp_path / "out", job="j", with_outputs=True).recover()


def test_emit_out_of_order_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(ValueError, match="consecutive from 0"):
        store.add(np.array([1, 2]), np.zeros((2, 3), dtype=np.float32))


def test_training_adopts_newest_complete_state(tmp_path: Path) -> None:
    store = _store(tmp_path, outputs=False)
    store.commit(end=10, state={"steps": 10})
    progress = (tmp_path / "out" / "progress.json").read_bytes()
    store.commit(end=20, state={"steps": 20})
    (tmp_path / "out" / "progress.json").write_bytes(progress)
    got = ProgressStore(tmp_path / "out", job="j", with_outputs=False).recover()
    assert (got.end, got.state) == (20, {"steps": 20})


def _drive(manifest: Path, batch: int, every: int) -> subprocess.Popen[str]:
    return start_drive(manifest, batch, every)


def _finished(proc: subprocess.Popen[str]) -> None:
    """Wait for an uninterrupted driver (the reference run, started beside the killed one on the other core)."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.splitlines()[-1] == "DONE", err


def _run_killed(manifest: Path, batch: int, every: int, *, seed: int, max_kills: int) -> int:
    """Run the driver, SIGKILL it at random moments until it finishes; returns the number of kills."""
    rng = random.Random(seed)
    kills = 0
    for _ in range(max_kills + 20):
        proc = _drive(manifest, batch, every)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # READY: recovery is done, the work loop starts
        if kills < max_kills and line.startswith("READY"):
            time.sleep(rng.uniform(0.0, 0.25))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)  # reaps it and closes the pipes
            kills += proc.returncode == -signal.SIGKILL
            continue
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        if "DONE" in line + out:
            return kills
    raise AssertionError("the driver never finished")


@pytest.mark.slow
def test_inference_sigkill_at_random_points_is_byte_identical(jobs_dir: Path) -> None:
    params = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16}
    clean = write_job(jobs_dir / "a", "clean", total=600, parameters=params)
    killed = write_job(jobs_dir / "b", "killed", total=600, parameters=params)
    reference = _drive(clean, 8, 2)
    kills = _run_killed(killed, 8, 2, seed=1234, max_kills=6)
    _finished(reference)
    assert kills >= 3
    a, b = (jobs_dir / d / "out" / n for d, n in (("a", "clean"), ("b", "killed")))
    rows = read_outputs(b)
    assert rows["sample_id"].tolist() == list(range(600))  # each sample exactly once, in order
    assert (a / "outputs.npy").read_bytes() == (b / "outputs.npy").read_bytes()
    assert rows.tobytes() == np.load(a / "outputs.npy").tobytes()


@pytest.mark.slow
def test_training_sigkill_resumes_from_checkpoint(jobs_dir: Path) -> None:
    params = {"features": 8, "hidden": 16, "classes": 3, "batchSize": 16, "checkpointEverySteps": 5}
    kw = {"builtin": "train-classifier", "kind": "training", "total": 120, "parameters": params}
    clean = write_job(jobs_dir / "a", "clean", **kw)  # type: ignore[arg-type]
    killed = write_job(jobs_dir / "b", "killed", **kw)  # type: ignore[arg-type]
    reference = _drive(clean, 16, 1)
    kills = _run_killed(killed, 16, 1, seed=99, max_kills=3)
    _finished(reference)
    assert kills >= 2
    a, b = (torch.load(jobs_dir / d / "out" / n / "model.pt") for d, n in (("a", "clean"), ("b", "killed")))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
