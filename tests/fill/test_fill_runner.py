"""The runner against a real producer process on the real channel: work only inside bubbles, overrun bounded, progress
committed, and a clean stop when the trainer dies."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from fill_helpers import start_executor, start_producer, write_job
from sharing import own_core
from waiting import wait_for

from pipefill.channel import hold_fill
from pipefill.events import CommitEvent, ExitEvent, FillEvent, HoldEvent, ProfileEvent, StartEvent, read_events
from pipefill_fill.store import ProgressStore

pytestmark = pytest.mark.slow

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16]}


def _cpu() -> int:
    return own_core()


def _start(
    tmp_path: Path,
    jobs: Path,
    *,
    bubbles_ms: str,
    count: int,
    compute_ms: float = 15.0,
    close_at: float = 1.0,
    priority: str | None = None,
) -> tuple[Any, Any]:
    fill = start_executor(tmp_path / "channel", jobs, tmp_path / "fill", cpu=_cpu(), priority=priority)
    producer = start_producer(
        tmp_path / "channel",
        bubbles_ms=bubbles_ms,
        count=count,
        compute_ms=compute_ms,
        cpu=_cpu(),
        log=tmp_path / "producer.jsonl",
        warmup=20,  # the executor's start (its job claimed, its store opened) is not what is measured
        close_at=close_at,
    )
    return fill, producer


def _finish(proc: Any, timeout_s: float = 60) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err or ""


@pytest.mark.alone  # times a quiet core (tests/sharing.py)
def test_work_only_inside_bubbles_and_overrun_bounded(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write_job(jobs, "enc", total=10**6, parameters=PARAMS, output=tmp_path / "out" / "enc")
    fill, producer = _start(tmp_path, jobs, bubbles_ms="30,10,60", count=80)
    assert _finish(producer)[0] == 0
    rc, err = _finish(fill)
    assert rc == 0, err
    closes = {r["id"]: r for r in map(json.loads, (tmp_path / "producer.jsonl").read_text().splitlines())}
    events = read_events(tmp_path / "fill" / "fill-events.jsonl")
    bubbles = [e for e in events if isinstance(e, FillEvent) and e.id in closes]  # the 80 logged ones
    assert len(bubbles) >= 70 and events[-1] == ExitEvent(
        reason="trainer gone", wall_s=events[-1].wall_s, mono_ns=events[-1].mono_ns, pid=events[-1].pid
    )
    worked = [b for b in bubbles if b.spans_ns]
    assert len(worked) >= 40 and sum(b.items for b in bubbles) > 0
    # the floor the executor published for the trainer's announcements (#25): its wake-up, the guard (1 ms) and its
    # smallest step, well below the 10 ms bubbles it used (the producer logged it as it read it after each bubble)
    floor_s = closes[max(closes)]["fill_floor_ns"] / 1e9
    assert 0.001 < floor_s < 0.010, floor_s
    for b in worked:
        close_ns = closes[b.id]["close_ns"]
        for start, end in b.spans_ns:
            assert b.open_ns <= start < close_ns, f"bubble {b.id}: a step started outside the bubble"
            assert end - b.expected_end_ns < 100e6, f"bubble {b.id}: a step ran {end - b.expected_end_ns} ns over"
        assert b.overrun_s < 0.1
        assert (b.overrun_cause is not None) == (b.overrun_s > 0.001)  # past the guard (1 ms), and only there
        # the close as the fill read it after yielding (the producer logs its own clock just after closing), and the
        # trainer's wait for the fill from there: none while the bubble was still open
        if b.closed_ns:
            assert 0 <= close_ns - b.closed_ns < 1e6, (b, close_ns)
            wait_s = max(0, b.yielded_ns - b.closed_ns) / 1e9
            assert b.trainer_wait_s == pytest.approx(wait_s, abs=1e-9) or b.trainer_wait_s == 0  # 0: preempted
        else:
            assert close_ns >= b.yielded_ns and b.trainer_wait_s == 0, (b, close_ns)
    committed = [e.end for e in events if isinstance(e, CommitEvent)]
    assert committed and committed[-1] > 0
    status = json.loads((jobs / "enc.status.json").read_text())
    epoch = status["epoch"]  # the files source's last placement; a store opened with an older one is refused
    recovered = ProgressStore(tmp_path / "out" / "enc", job="enc", with_outputs=True, epoch=epoch).recover()
    assert recovered.end == committed[-1] and recovered.adopted == 0 and recovered.removed == 0
    assert status["phase"] == "Running" and status["samplesDone"] == recovered.end


def test_a_trainer_back_early_waits_for_the_fill_at_most_a_step_and_it_is_recorded(tmp_path: Path) -> None:
    # each 30 ms bubble closes after 12-30 ms: the fill, planning to the expected end, sees the close before its next
    # step and yields; on the same core at normal priority (as on a GPU: the trainer cannot take the device back) the
    # trainer waits from its close to the end of the step it found running, which each record keeps
    jobs = tmp_path / "jobs"
    write_job(jobs, "enc", total=10**6, parameters=PARAMS, output=tmp_path / "out" / "enc")
    fill, producer = _start(tmp_path, jobs, bubbles_ms="30", count=60, close_at=0.4, priority="normal")
    assert _finish(producer)[0] == 0
    assert _finish(fill)[0] == 0
    log = [json.loads(line) for line in (tmp_path / "producer.jsonl").read_text().splitlines()]
    closes = {r["id"]: (r["closing_ns"], r["close_ns"]) for r in log}  # the channel's close time is between the two
    worked = [
        e
        for e in read_events(tmp_path / "fill" / "fill-events.jsonl")
        if isinstance(e, FillEvent) and e.id in closes and e.spans_ns
    ]
    # bubbles the trainer closed before the fill yielded, in most of which it found a step running
    late = [b for b in worked if b.closed_ns]
    assert sum(b.trainer_wait_s > 0 for b in late) >= 3, late
    for b in worked:
        if b.closed_ns:
            # the channel's close time: the trainer's (on this shared core, waking the fill may preempt the trainer
            # between the two readings around it: 4.6 ms in a CI run)
            assert closes[b.id][0] <= b.closed_ns <= closes[b.id][1], (b, closes[b.id])
            # the wait is the rest of the step (or commit) that ran at the close (on this shared core the trainer's spin
            # stretches it 2-4x): nothing started after the close (a due commit waits for the next bubble)
            work = [*b.spans_ns, *b.commits_ns]
            assert all(start < b.closed_ns for start, _ in work), b
            assert b.trainer_wait_s == pytest.approx(max(0, max(e for _, e in work) - b.closed_ns) / 1e9, abs=1e-9)
        else:
            assert closes[b.id][1] >= b.yielded_ns and b.trainer_wait_s == 0, (b, closes[b.id])


def test_trainer_death_stops_the_executor_cleanly(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write_job(jobs, "enc", total=10**6, parameters=PARAMS, output=tmp_path / "out" / "enc")
    fill, producer = _start(tmp_path, jobs, bubbles_ms="40", count=100000)
    log = tmp_path / "fill" / "fill-events.jsonl"

    def worked() -> bool:
        """Work done and the profile complete: what a bubble did while profiling is committed once the profile is
        (a run under load had its trainer killed in between, and nothing to commit at shutdown)."""
        events = read_events(log)
        return any(isinstance(e, ProfileEvent) for e in events) and any(
            isinstance(e, FillEvent) and e.items for e in events
        )

    wait_for(worked, "work done with the profile complete", 60, 0.2)
    # pinned to its trainer's core, the executor takes only the CPU time the trainer leaves
    assert os.sched_getscheduler(fill.pid) == os.SCHED_IDLE
    (start,) = [e for e in read_events(log) if isinstance(e, StartEvent)]
    assert start.cpu_priority == "idle" and start.cpus == [_cpu()]
    producer.send_signal(signal.SIGKILL)
    producer.communicate(timeout=10)
    t0 = time.monotonic()
    rc, err = _finish(fill, timeout_s=30)
    assert rc == 0, err
    assert time.monotonic() - t0 < 15
    events = read_events(log)
    assert isinstance(events[-1], ExitEvent) and events[-1].reason == "trainer gone"
    last_commit = [e for e in events if isinstance(e, CommitEvent)][-1]
    assert last_commit.at == "shutdown" and last_commit.end > 0
    out = tmp_path / "out" / "enc"
    epoch = json.loads((out / "progress.json").read_text())["epoch"]  # the executor's: an older one is refused
    recovered = ProgressStore(out, job="enc", with_outputs=True, epoch=epoch).recover()
    assert recovered.end == last_commit.end
    assert "stopping: trainer gone" in err


def _wait_event(log: Path, match: Any, what: str, timeout_s: float = 60.0) -> Any:
    return wait_for(
        lambda: next((e for e in read_events(log) if match(e)), None), f"the executor to log {what}", timeout_s
    )


def test_a_held_executor_takes_no_bubble_while_the_trainer_goes_on_announcing(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write_job(jobs, "enc", total=10**6, parameters=PARAMS, output=tmp_path / "out" / "enc")
    fill, producer = _start(tmp_path, jobs, bubbles_ms="20", count=100000, compute_ms=10.0)
    log = tmp_path / "fill" / "fill-events.jsonl"
    try:
        _wait_event(log, lambda e: isinstance(e, FillEvent) and e.items, "work in a bubble")
        hold_fill(tmp_path / "channel", True)
        held = _wait_event(log, lambda e: isinstance(e, HoldEvent) and e.held, "the hold")
        time.sleep(0.5)  # ~16 bubbles announced meanwhile
        hold_fill(tmp_path / "channel", False)
        released = _wait_event(log, lambda e: isinstance(e, HoldEvent) and not e.held, "the release")
        _wait_event(log, lambda e: isinstance(e, FillEvent) and e.open_ns > released.mono_ns, "a bubble after it")
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.communicate(timeout=10)
        _finish(fill)
    taken = [e.woke_ns for e in read_events(log) if isinstance(e, FillEvent)]
    assert not [t for t in taken if held.mono_ns < t < released.mono_ns]  # no bubble taken while held (one still
    # open at the release may be taken right after it)
    announced = [r["open_ns"] for r in map(json.loads, (tmp_path / "producer.jsonl").read_text().splitlines())]
    assert sum(held.mono_ns < t < released.mono_ns for t in announced) >= 5  # though the trainer announced them
