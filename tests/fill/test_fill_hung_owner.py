"""A previous owner that lives on but hangs inside a commit (a stopped process, storage that stopped answering) keeps
its slice's commit lock. Opening that slice gives up after a time limit, touches nothing, and only that job waits:
the executor's other jobs start, and the job is tried again later and resumes once the lock is free. The holder here
is a real process holding a real flock."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from commit_helpers import cpu_jobs
from fill_helpers import write_job

from pipefill import env
from pipefill.events import EventWriter, SliceEvent, read_events
from pipefill.spec import load_file
from pipefill_fill.locks import LockBusy
from pipefill_fill.sources import Identity, open_source
from pipefill_fill.store import ProgressStore
from pipefill_fill.task import FillTask, TaskSpec

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16}
_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # hangs holding it until the test closes stdin
"""


class Holder:
    """A process that takes ``path``'s lock and hangs with it until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.communicate(timeout=30)  # closes its stdin: it exits, and the kernel drops the lock


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        h.release()


def _spec(manifest: Path) -> TaskSpec:
    (job,) = load_file(manifest)
    return TaskSpec.from_spec(job)  # type: ignore[arg-type]


def test_recovery_gives_up_on_a_hung_holder_and_touches_nothing(jobs_dir: Path, holders: list[Holder]) -> None:
    out = jobs_dir / "out" / "j"
    spec = _spec(write_job(jobs_dir, "j", total=64, parameters=PARAMS, output=out))
    task = FillTask(spec, epoch=1)
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    task.step(16)
    task.commit()
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    holders.append(Holder(out / ".commit.lock"))
    store = ProgressStore(out, job="j", with_outputs=True, epoch=2)
    t0 = time.monotonic()
    with pytest.raises(LockBusy, match=r"\.commit\.lock: locked by another process for over 0\.3 s .*fuser -v"):
        store.recover(lock_timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    holders[-1].release()
    recovered = store.recover(lock_timeout_s=0.3)
    assert recovered.end == 16 and json.loads((out / "progress.json").read_text())["epoch"] == 2


def test_only_the_locked_job_waits_and_it_resumes_once_the_lock_is_free(
    jobs_dir: Path, holders: list[Holder], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    write_job(jobs_dir, "free", total=64, parameters=PARAMS, output=tmp_path / "out" / "free")
    write_job(jobs_dir, "stuck", total=64, parameters=PARAMS, output=tmp_path / "out" / "stuck")
    holders.append(Holder(tmp_path / "out" / "stuck" / ".commit.lock"))  # a previous owner, hung inside a commit
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    log = tmp_path / "fill-events.jsonl"
    jobs = cpu_jobs(
        source,
        EventWriter(log),
        max_active=2,
        lock_timeout_s=0.3,
        lock_retry_s=60.0,
    )

    def busy() -> list[SliceEvent]:
        jobs.events.flush()
        return [e for e in read_events(log) if isinstance(e, SliceEvent) and e.phase == "busy"]

    try:
        jobs.refresh()
        assert set(jobs.active) == {"free"} and not jobs.failed  # the other job started; the stuck one did not fail
        assert [(e.job, e.start, e.end) for e in busy()] == [("stuck", 0, 64)]
        status = json.loads((jobs_dir / "stuck.status.json").read_text())
        assert "locked by another process" in status["message"], status
        jobs.refresh()
        assert set(jobs.active) == {"free"} and len(busy()) == 1  # not tried again before lock_retry_s
        holders[-1].release()
        jobs.busy_until = {name: 0.0 for name in jobs.busy_until}  # as when lock_retry_s has passed
        jobs.refresh()
        assert set(jobs.active) == {"free", "stuck"} and len(busy()) == 1
    finally:
        jobs.shutdown()
        source.close()
        jobs.events.close()
