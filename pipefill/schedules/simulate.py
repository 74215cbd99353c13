"""Discrete-event simulation of one step: each rank runs its actions in order, as soon as it is free and the data
each action needs has arrived.

Data arrival: ``F`` of stage ``s`` needs ``F`` of ``s − 1``; ``B``/``I`` of ``s`` needs ``B``/``I`` of ``s + 1`` (the
last stage: its own ``F``); ``W`` needs its ``I``. Data from another rank arrives ``Costs.p2p_s`` after the producing
action ends (sends overlap compute); data from the same rank (the V's turn, own F/I) at once. After its last action
each rank spends ``Costs.step_end_s`` on gradient all-reduce and optimizer; the step ends when the slowest rank is done.
"""

from __future__ import annotations

from pipefill.schedules.costs import Costs
from pipefill.schedules.memory import MemoryModel, in_flight_after, peak_in_flight
from pipefill.schedules.model import Kind, Schedule, ScheduleError
from pipefill.schedules.timeline import ActionSpan, BubbleSpan, RankTimeline, Timeline
from pipefill.schedules.validate import Key, dependencies, produces, validate_schedule

__all__ = ["simulate"]

MIN_BUBBLE_S = 1e-9
"""idle gaps shorter than this (seconds; 1 ns) are rounding noise, not bubbles"""


def simulate(schedule: Schedule, costs: Costs, memory: MemoryModel | None = None, *, validate: bool = True) -> Timeline:
    """Simulate ``schedule`` with ``costs``; ``memory`` adds free device memory to every bubble.

    Raises :class:`ScheduleError` for a schedule that cannot run (``validate=False`` skips the up-front check of
    a schedule you already validated; a deadlock is still reported).
    """
    if validate:
        validate_schedule(schedule)
    spans = _run(schedule, costs)
    step_s = max((s[-1].end_s if s else 0.0) + costs.step_end_s for s in spans)
    ranks = tuple(_rank_timeline(schedule, costs, memory, r, spans[r], step_s) for r in range(schedule.num_ranks))
    return Timeline(schedule=schedule, costs=costs, memory=memory, step_s=step_s, ranks=ranks)


def _run(schedule: Schedule, costs: Costs) -> list[list[ActionSpan]]:
    n, placement = schedule.num_stages, schedule.placement
    ready: dict[Key, float] = {}  # key -> end time of the action producing it
    spans: list[list[ActionSpan]] = [[] for _ in schedule.ranks]
    free_at = [0.0] * schedule.num_ranks
    heads = [0] * schedule.num_ranks
    remaining = sum(len(a) for a in schedule.ranks)
    while remaining:
        moved = False
        for rank, actions in enumerate(schedule.ranks):
            i = heads[rank]
            while i < len(actions):
                action = actions[i]
                start = free_at[rank]
                for dep in dependencies(action, n):
                    end = ready.get(dep)
                    if end is None:
                        break
                    if placement[dep[0]] != rank:
                        end += costs.p2p_s(min(dep[0], action.stage_idx))
                    start = max(start, end)
                else:
                    finish = start + costs.action_s(action.kind, action.stage_idx)
                    spans[rank].append(ActionSpan(action, start, finish))
                    for key in produces(action):
                        ready[key] = finish
                    free_at[rank] = finish
                    i += 1
                    continue
                break
            if i != heads[rank]:
                remaining -= i - heads[rank]
                heads[rank] = i
                moved = True
        if not moved:
            validate_schedule(schedule)  # names the first action that can never run
            raise ScheduleError(f"schedule {schedule.name!r} deadlocks")  # pragma: no cover - validate raised
    return spans


def _rank_timeline(
    schedule: Schedule, costs: Costs, memory: MemoryModel | None, rank: int, spans: list[ActionSpan], step_s: float
) -> RankTimeline:
    order = schedule.ranks[rank]
    stages = schedule.stages_of(rank)
    held = in_flight_after(order)
    first_grad = next((k for k, a in enumerate(order) if a.kind in (Kind.B, Kind.I)), len(order))
    last_fwd = max((k for k, a in enumerate(order) if a.kind is Kind.F), default=-1)

    def bubble(start: float, end: float, idx: int, kind: str) -> BubbleSpan:
        free = memory.free_bytes(stages, held[idx]) if memory is not None else None
        return BubbleSpan(rank, start, end - start, kind, idx, sum(held[idx].values()), free)

    bubbles: list[BubbleSpan] = []
    prev_end = 0.0
    for k, span in enumerate(spans):
        if span.start_s - prev_end > MIN_BUBBLE_S:
            bubbles.append(bubble(prev_end, span.start_s, k, _kind(k, first_grad, last_fwd)))
        prev_end = span.end_s
    tail = prev_end + costs.step_end_s
    if step_s - tail > MIN_BUBBLE_S:
        bubbles.append(bubble(tail, step_s, len(order), "end-of-step"))
    busy = sum(s.duration_s for s in spans) + costs.step_end_s
    peak_used = max(memory.used_bytes(stages, h) for h in held) if memory is not None else None
    return RankTimeline(rank, stages, tuple(spans), busy, tuple(bubbles), peak_in_flight(order), peak_used)


def _kind(idx: int, first_grad: int, last_fwd: int) -> str:
    """Kind of the gap right before action ``idx`` (see :mod:`pipefill.schedules.timeline`)."""
    if idx <= first_grad:
        return "warm-up"
    if idx - 1 >= last_fwd:
        return "cool-down"
    return "steady"
