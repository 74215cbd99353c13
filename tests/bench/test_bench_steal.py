"""The VM's steal time on the fill's core (pipefill.bench.steal): read from /proc/stat's format, sampled by a thread
of its own, attributed to the bubbles it fell in, and left out of the overruns reported without it."""

from __future__ import annotations

import os
from pathlib import Path

from waiting import wait_for

from pipefill.bench.steal import StealSampler, read_steal_ticks, steal_summary
from pipefill.events import FillEvent

MS = 1_000_000
TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def _stat(path: Path, steal: int) -> Path:
    path.write_text(
        "cpu  100 0 50 1000 5 0 3 17 0 0\n"
        "cpu0 60 0 30 500 3 0 2 7 0 0\n"
        f"cpu1 40 0 20 500 2 0 1 {steal} 0 0\n"
        "intr 12345\n"
    )
    return path


def test_the_steal_column_of_a_core_is_read(tmp_path: Path) -> None:
    stat = _stat(tmp_path / "stat", 10)
    assert read_steal_ticks(1, stat) == 10 and read_steal_ticks(0, stat) == 7
    assert read_steal_ticks(5, stat) is None  # no such core
    assert read_steal_ticks(0, tmp_path / "absent") is None
    assert isinstance(read_steal_ticks(0), int)  # this machine's kernel reports it


def test_steal_is_counted_in_the_interval_it_fell_in_only(tmp_path: Path) -> None:
    sampler = StealSampler(1, stat=_stat(tmp_path / "stat", 0), interval_s=0.005)
    for t_ms, ticks in [(0, 0), (100, 3), (200, 3), (400, 5)]:
        sampler.add(t_ms * MS, ticks)
    assert sampler.times == [0, 100 * MS, 400 * MS]  # kept where the count moved
    assert sampler.stolen_ms(80 * MS, 89 * MS) == 0.0  # ended more than two intervals before the move
    assert sampler.stolen_ms(95 * MS, 96 * MS) == 3 * TICK_MS  # seen up to two intervals after the end: counted
    assert sampler.stolen_ms(150 * MS, 300 * MS) == 0.0  # a change before and one long after: neither
    assert sampler.stolen_ms(50 * MS, 450 * MS) == 5 * TICK_MS
    assert sampler.total_ms() == 5 * TICK_MS


def test_the_sampler_follows_the_count_on_a_thread_of_its_own(tmp_path: Path) -> None:
    stat = _stat(tmp_path / "stat", 4)
    sampler = StealSampler(1, stat=stat, interval_s=0.002).start()
    try:
        wait_for(lambda: sampler.ticks == [4], "the first sample")
        _stat(tmp_path / "stat.new", 9).replace(stat)  # whole, as the kernel shows it
        wait_for(lambda: sampler.ticks == [4, 9], "the count's move sampled")
    finally:
        sampler.stop()
    assert sampler.total_ms() == 5 * TICK_MS


def _bubble(i: int, overrun_ms: float, cause: str | None) -> FillEvent:
    open_ns = i * 100 * MS
    return FillEvent(
        id=i, kind="steady", open_ns=open_ns, expected_end_ns=open_ns + 10 * MS, woke_ns=open_ns,
        yielded_ns=open_ns + 10 * MS + int(overrun_ms * MS), steps=1, items=1, used_s=0.01,
        overrun_s=overrun_ms / 1e3, overrun_cause=cause,
    )  # fmt: skip


def test_overruns_without_the_bubbles_the_vm_took_the_core_in(tmp_path: Path) -> None:
    sampler = StealSampler(1, stat=_stat(tmp_path / "stat", 0), interval_s=0.001)
    sampler.add(0, 0)
    sampler.add(205 * MS, 9)  # stolen during bubble 2, which overran by 90 ms
    sampler.add(10_000 * MS, 9)
    bubbles = [_bubble(0, 0.0, None), _bubble(1, 0.2, None), _bubble(2, 90.0, "step"), _bubble(3, 3.0, "step")]
    summary = steal_summary(sampler, bubbles)
    assert summary["bubbles"] == 1 and summary["past_guard"] == 1
    assert summary["overrun_max_ms_without"] == 3.0  # bubble 3's, its own
    assert summary["total_ms"] == round(9 * TICK_MS, 1)
