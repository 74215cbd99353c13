"""The commit writer is quiet while a bubble is filled (issue #31): each fsync makes the kernel work on the writer's
core, which preempted the filling thread's steps; and where each step's time went is recorded."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from commit_helpers import PARAMS, bubble, open_task
from fill_helpers import write_job

from pipefill_fill.atomic import atomic_write_bytes
from pipefill_fill.commits import CommitWriter, Quiet
from pipefill_fill.steptrace import StepTrace, mark
from pipefill_fill.store import read_pointer
from pipefill_fill.task import FillTask


class WatchedQuiet(Quiet):
    """A :class:`Quiet` that counts the writer's pauses and says when one waits for a bubble to end."""

    def __init__(self, *, wait_s: float = 30.0) -> None:
        super().__init__(wait_s=wait_s)
        self.pauses = 0
        self.waiting = threading.Event()

    def wait(self) -> bool:
        self.pauses += 1
        if not self._outside.is_set():
            self.waiting.set()
        return super().wait()


def _commit_staged_inside(jobs_dir: Path, quiet: Quiet) -> FillTask:
    """A task whose commit's device part was made in a bubble while ``quiet`` says a bubble is filled."""
    task = open_task(write_job(jobs_dir, "enc", total=10**4, parameters=PARAMS))
    task.writer = CommitWriter(quiet=quiet)
    quiet.enter()
    for i in range(8):
        if bubble(task, left_s=0.02, commit_s=0.0, bubble_id=i).commits_ns:
            return task
    raise AssertionError("no commit was staged in 8 bubbles")


def test_the_writer_touches_no_file_while_a_bubble_is_filled(jobs_dir: Path) -> None:
    quiet = WatchedQuiet()
    task = _commit_staged_inside(jobs_dir, quiet)
    assert task.writer is not None
    try:
        assert quiet.waiting.wait(10)  # the file part waits at its first pause ...
        assert task.inflight is not None and not task.inflight.done.is_set()
        assert read_pointer(task.store.dir, start=0) == (0, False)  # ... having written nothing
        assert not list(task.store.states_dir.glob("state-*"))
        staged = task.inflight.staged.end
        quiet.leave()  # the filling thread left the bubble: the commit is written
        pending = task.settle(timeout_s=10)
        assert pending is not None and pending.error is None and pending.written > 0
        assert read_pointer(task.store.dir, start=0)[0] == staged == task.committed
        assert quiet.pauses >= 9  # before the write and each fsync of the state, the chunk and the pointer
    finally:
        quiet.leave()
        task.writer.close(10)


def test_a_bubble_that_never_ends_delays_a_commit_by_the_quiet_wait_only(jobs_dir: Path) -> None:
    quiet = WatchedQuiet(wait_s=0.02)
    task = _commit_staged_inside(jobs_dir, quiet)  # and never left
    assert task.writer is not None and task.inflight is not None
    try:
        staged = task.inflight.staged.end
        pending = task.settle(timeout_s=30)
        assert pending is not None and pending.error is None and task.committed == staged
        assert pending.write_s >= quiet.pauses * 0.02 and quiet.pauses >= 9  # each pause waited its limit
    finally:
        task.writer.close(10)


def test_atomic_write_pauses_before_the_write_and_each_fsync(tmp_path: Path) -> None:
    target = tmp_path / "d" / "file.bin"
    seen: list[tuple[bool, list[str]]] = []

    def pause() -> None:  # what is on disk at each pause: the target, and the temporary file's sizes
        seen.append((target.exists(), sorted(str(p.stat().st_size) for p in target.parent.glob(".file.bin.*"))))

    atomic_write_bytes(target, b"x" * 100, pause=pause)
    # before the write: nothing; before the file's fsync: the temporary file written; before the directory's: renamed
    assert seen == [(False, []), (False, ["100"]), (True, [])]
    assert target.read_bytes() == b"x" * 100


def test_each_step_says_where_its_time_went(jobs_dir: Path) -> None:
    task = open_task(write_job(jobs_dir, "enc", total=10**4, parameters=PARAMS))
    out = bubble(task, left_s=0.05, commit_s=0.0)
    assert out.steps and len(out.traces) == len(out.spans_ns)
    for (start, end), trace in zip(out.spans_ns, out.traces, strict=True):
        span_us = (end - start) / 1e3
        assert 0 < trace.host_us <= span_us and 0 < trace.cpu_us <= span_us + 50  # a CPU step: all host time
        assert trace.voluntary >= 0 and trace.involuntary >= 0


def test_a_step_that_blocks_shows_little_cpu_and_a_voluntary_switch() -> None:
    before, t0 = mark(), time.monotonic_ns()
    time.sleep(0.02)  # what is measured: a thread that blocks
    trace = StepTrace.between(before, mark(), host_ns=time.monotonic_ns() - t0)
    assert trace.host_us >= 20_000 and trace.cpu_us < 5_000 and trace.voluntary >= 1
    assert trace.row() == (trace.host_us, trace.cpu_us, trace.voluntary, trace.involuntary, trace.faults)


def test_a_step_that_touches_fresh_memory_shows_its_page_faults() -> None:
    """64 MiB mapped and written for the first time: one fault a page at least (4 KiB pages, or fewer huge ones)."""
    before, t0 = mark(), time.monotonic_ns()
    fresh = mmap.mmap(-1, 64 << 20)
    for offset in range(0, len(fresh), 4096):
        fresh[offset] = 1
    trace = StepTrace.between(before, mark(), host_ns=time.monotonic_ns() - t0)
    fresh.close()
    assert trace.faults >= 32, trace  # 2 MiB huge pages: 32; 4 KiB pages: 16 384
    quiet, t1 = mark(), time.monotonic_ns()
    sum(range(10_000))  # touches nothing new
    assert StepTrace.between(quiet, mark(), host_ns=time.monotonic_ns() - t1).faults < 32


_IDLE_STEP = """
import json, os, sys, time
os.sched_setaffinity(0, {CPU})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
from pipefill_fill.steptrace import StepTrace, mark
print("ready", flush=True)
sys.stdin.readline()
before, t0 = mark(), time.monotonic_ns()
print("stepping", flush=True)  # the trainer wakes on this core now
while time.monotonic_ns() - t0 < 300_000_000:  # a 'step' of 300 ms of wall time, spinning
    pass
print(json.dumps(StepTrace.between(before, mark(), host_ns=time.monotonic_ns() - t0).row()), flush=True)
"""

_TRAINER = """
import os, sys, time
os.sched_setaffinity(0, {CPU})
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
while time.monotonic() - t0 < 0.15:  # the trainer's compute: 150 ms at normal priority on the same core
    pass
"""


def test_a_step_the_trainer_preempts_on_its_core_shows_involuntary_switches_and_little_cpu() -> None:
    cpu = min(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    fill = subprocess.Popen(
        [sys.executable, "-c", _IDLE_STEP.replace("{CPU}", f"{{{cpu}}}")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAINER.replace("{CPU}", f"{{{cpu}}}")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    procs = (fill, trainer)
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # the step starts; once it runs, the trainer's compute does (at idle priority the step
            # could not even read its go while the trainer had the core)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc is trainer or proc.stdout.readline().strip() == "stepping"
        assert fill.stdout is not None
        host_us, cpu_us, _, involuntary, _ = json.loads(fill.stdout.readline())
        assert trainer.wait(30) == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    # at idle priority the spinning step had the core only when the trainer did not want it: it lost it at least
    # once, and ran for well under its wall time
    assert host_us >= 300_000 and involuntary >= 1 and cpu_us < host_us - 50_000, (host_us, cpu_us, involuntary)
