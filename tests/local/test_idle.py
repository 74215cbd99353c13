"""Where the idle time goes: each trainer wait cut into pieces that add up to its length, whatever order the two logs'
records come in; recovery counts only fill steps inside waits."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipefill.events import BubbleEvent, Event, FillEvent, HoldEvent, StartEvent
from pipefill.local.idle import IdleAccount, breakdown_markdown, breakdown_rows
from pipefill.local.stats import RankStats, merged

MS = 1_000_000


def wait(step: int, start_ms: float, end_ms: float, *, kind: str = "steady", announced: bool = True) -> BubbleEvent:
    return BubbleEvent(
        step=step,
        idx=1,
        kind=kind,
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
        predicted_s=0.01,
        announced=announced,
        mono_ns=int(end_ms * MS) + 50 * MS,  # the trainer writes its records at the end of the step
    )


def fill(open_ms: float, end_ms: float, woke_ms: float, yielded_ms: float, spans: list[tuple[float, float]],
         *, commits: list[tuple[float, float]] = (), batch: int | None = 8, stop: str = "time") -> FillEvent:  # fmt: skip
    return FillEvent(
        id=1,
        kind="steady",
        open_ns=int(open_ms * MS),
        expected_end_ns=int(end_ms * MS),
        woke_ns=int(woke_ms * MS),
        yielded_ns=int(yielded_ms * MS),
        batch_size=batch,
        steps=len(spans),
        items=8 * len(spans),
        used_s=0.0,
        overrun_s=0.0,
        stop=stop,
        spans_ns=[[int(a * MS), int(b * MS)] for a, b in spans],
        commits_ns=[[int(a * MS), int(b * MS)] for a, b in commits],
        mono_ns=int(yielded_ms * MS) + 1,
    )


def _ms(account: IdleAccount) -> dict[str, float]:
    return {k: round(v * 1e3, 6) for r in account.by_kind.values() for k, v in r.items() if v}


def test_a_used_wait_is_cut_into_pieces_that_add_up_to_its_length() -> None:
    account = IdleAccount()
    account.add(StartEvent(device="cpu", memory_budget_bytes=1, guard_s=0.0005, training_job="j", rank=0))
    account.add(wait(1, 100.0, 112.0))  # the rank waited 12 ms; predicted end 110 (it lasted 2 ms longer)
    account.add(fill(100.01, 110.0, 100.2, 109.3, [(100.3, 104.0), (104.1, 106.0), (106.5, 109.2)],
                     commits=[(106.0, 106.4)]))  # fmt: skip
    account.flush()
    assert _ms(account) == {
        "wake_up": 0.2,
        "switch_in": 0.1,
        "fill_steps": 3.7 + 1.9 + 2.7,
        "between_steps": 0.1 + 0.1,
        "commit": 0.4,
        "yield": 0.1,
        "tail_short": 0.2,  # 109.3 → 109.5: no step fitted before the guard
        "guard": 0.5,
        "beyond_prediction": 2.0,
    }
    assert account.idle_s() == pytest.approx(0.012)


def test_the_fills_own_deadline_splits_the_tail() -> None:
    account = IdleAccount()
    early = dataclasses.replace(fill(0.0, 10.0, 0.1, 5.2, [(0.2, 5.0)]), deadline_ns=7 * MS)  # planned to stop at 7
    account.add(wait(1, 0.0, 12.0))
    account.add(early)
    late = dataclasses.replace(fill(20.0, 30.0, 20.1, 31.0, [(20.2, 30.9)]), deadline_ns=31 * MS)  # planned past 30
    account.add(wait(2, 20.0, 32.0))
    account.add(late)
    account.flush()
    got = _ms(account)
    assert got["tail_short"] == pytest.approx(1.8)  # 5.2 → 7: nothing fitted what it planned for
    assert got["guard"] == pytest.approx(3.0)  # 7 → 10: its margin before the trainer's expected end
    assert got["beyond_prediction"] == pytest.approx(2.0 + 1.0)  # 10 → 12, and 31 → 32 past its own plan
    assert account.idle_s() == pytest.approx(0.024)


def test_unused_waits_say_why() -> None:
    account = IdleAccount()
    account.add(wait(1, 0.0, 1.5, announced=False))
    account.add(wait(1, 10.0, 14.0))
    account.add(fill(10.0, 14.0, 10.3, 10.31, [], stop="short"))
    account.add(HoldEvent(held=True, mono_ns=19 * MS))
    account.add(wait(2, 20.0, 30.0))  # held: the fill takes nothing
    account.add(HoldEvent(held=False, mono_ns=31 * MS))
    account.add(wait(3, 40.0, 45.0))  # released, but no fill record: the fill never took it
    account.add(wait(3, 50.0, 53.0))
    account.add(fill(50.0, 52.0, 50.1, 53.5, [(50.2, 53.5)]))  # ran 0.5 ms past the rank's resume
    account.flush()
    got = _ms(account)
    assert got == {
        "not_announced": 1.5,
        "wake_up": 0.3 + 0.1,
        "skipped_short": 3.7,
        "held": 10.0,
        "not_taken": 5.0,
        "switch_in": 0.1,
        "fill_steps": 2.8,
    }
    assert account.overrun_past_close_s == pytest.approx(0.0005)
    assert account.idle_s() == pytest.approx((1.5 + 4 + 10 + 5 + 3) / 1e3)


def test_records_in_any_order_give_the_same_account() -> None:
    events: list[Event] = []
    rnd = random.Random(3)
    for step in range(30):
        t = 100.0 * step
        events.append(wait(step, t, t + 10.0, kind="warm-up"))
        events.append(fill(t + 0.01, t + 9.5, t + 0.2, t + 9.0, [(t + 0.3, t + 5.0), (t + 5.1, t + 8.9)]))
        events.append(wait(step, t + 40.0, t + 41.0, announced=False))
    whole = IdleAccount()
    for e in [e for e in events if isinstance(e, BubbleEvent)] + [e for e in events if isinstance(e, FillEvent)]:
        whole.add(e)
    whole.flush()
    live = IdleAccount()
    shuffled = merged(events)  # the order they were written in, as a live tail reads them
    for e in shuffled:
        live.add(e)
    live.flush()
    swapped = IdleAccount()
    for i in range(0, len(events) - 1, 2):
        for e in (events[i + 1], events[i]) if rnd.random() < 0.5 else (events[i], events[i + 1]):
            swapped.add(e)
    if len(events) % 2:
        swapped.add(events[-1])
    swapped.flush()
    assert _ms(whole) == pytest.approx(_ms(live)) and _ms(whole) == pytest.approx(_ms(swapped))
    assert whole.piece_s("fill_steps") == pytest.approx(30 * 8.5e-3)


def test_recovery_counts_fill_steps_over_all_idle_time() -> None:
    stats = RankStats()
    for e in merged(
        [wait(1, 0.0, 10.0), wait(1, 20.0, 22.0, announced=False)],
        [fill(0.0, 10.0, 0.1, 9.9, [(0.2, 8.2)])],  # 8 ms of steps in 12 ms of idle, 10 announced
    ):
        stats.add(e)
    stats.finish()
    s = stats.summary()
    assert s["bubble_recovery"] == pytest.approx(8 / 12) and s["announced_recovery"] == pytest.approx(8 / 10)
    # holding the bubble without working raises nothing
    idle = RankStats()
    for e in merged([wait(1, 0.0, 10.0)], [fill(0.0, 10.0, 0.1, 9.9, [], stop="time")]):
        idle.add(e)
    idle.finish()
    assert idle.summary()["bubble_recovery"] == 0.0


def test_breakdown_rows_and_table() -> None:
    account = IdleAccount()
    account.add(wait(1, 0.0, 10.0, kind="warm-up"))
    account.add(fill(0.0, 10.0, 1.0, 9.0, [(1.0, 9.0)]))
    account.add(wait(1, 20.0, 22.0, kind="end-of-step", announced=False))
    account.flush()
    rows = breakdown_rows(account)
    assert [r["kind"] for r in rows] == ["end-of-step", "warm-up", "all"]
    assert rows[-1]["waits"] == 2 and rows[-1]["idle_s"] == pytest.approx(0.012)
    assert rows[-1]["share"]["fill_steps"] == pytest.approx(8 / 12)
    table = breakdown_markdown([(0, rows)])
    assert table[0].startswith("| rank | kind | waits | idle s | fill steps |")
    assert "| 0 | **all** | 2 | 0.012 | 66.7% |" in table[-1]


def test_pieces_carry_over_continuation_and_measurements_have_their_own_columns_and_count_as_work() -> None:
    """Issue #25: a bubble that measured (profiling), went on with a batch in flight, ran whole steps and pieces,
    then pieces past its planned end while still open — each span in its column, every one but profiling work."""
    spans = [(0.2, 1.2), (1.2, 2.2), (2.2, 5.2), (5.2, 6.2), (6.2, 7.2), (9.0, 11.0)]
    e = dataclasses.replace(fill(0.0, 10.0, 0.1, 11.0, spans), span_kinds="mcwppx", batch_sizes=[0, 8, 8, 8, 8, 8])
    stats = RankStats()
    for x in merged([wait(1, 0.0, 12.0)], [e]):
        stats.add(x)
    stats.finish()
    s = stats.summary()
    share = s["idle_breakdown"][-1]["seconds"]
    assert {k: round(share[k] * 1e3, 6) for k in ("profiling", "fill_carried", "fill_steps", "fill_pieces")} == {
        "profiling": 1.0,
        "fill_carried": 1.0,
        "fill_steps": 3.0,
        "fill_pieces": 2.0,
    }
    assert round(share["fill_continued"] * 1e3, 6) == 2.0  # (9.0, 11.0): past the planned end, the bubble open
    assert s["fill_step_s"] == pytest.approx(8e-3) and s["bubble_recovery"] == pytest.approx(8 / 12)
    table = breakdown_markdown([(0, s["idle_breakdown"])])
    assert "| fill steps | fill pieces | fill carried | fill continued | profiling |" in table[0]
