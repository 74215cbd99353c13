"""From the profiled steps to this rank's bubble slots: gather every stage's measured costs and every pipeline rank's
compute order as it ran (the schedule's own order, whatever class or CSV produced it) over the ranks, simulate that
schedule with those costs (:func:`pipefill.schedules.simulate`), keep this rank's bubbles.

The gather is the only collective the hook adds: one ``all_gather_object`` on a gloo group of all ranks, made once,
right after the last profiled step returns on every rank (every rank calls the schedule's ``step`` equally often, so
they all reach it at the same point of their collective order). It moves a few floats and changes no tensor of the
training.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from pipefill.schedules.costs import Costs
from pipefill.schedules.model import Action, Kind, Schedule, ScheduleError
from pipefill.schedules.simulate import simulate
from pipefill.schedules.timeline import Timeline
from pipefill.schedules.validate import validate_schedule
from pipefill_trainer.instrument import Slot, build_profile, slots_from

__all__ = ["Gathered", "Medians", "Prediction", "gather", "predict_slots", "schedule_as_ran"]

Medians = dict[int, dict[str, float]]
"""stage index → action kind → median seconds"""


@dataclass(frozen=True)
class Prediction:
    slots: dict[int, Slot]
    """by the index of the action each bubble precedes (``len(actions)``: the end of the step)"""
    mode: str
    """``simulated`` (the schedule's order and the measured costs) or ``learned`` (each wait's own history)"""
    why: str
    """for ``learned``: why the order could not be used"""
    profile: dict[str, Any] | None = None
    timeline: Timeline | None = None


@dataclass(frozen=True)
class Gathered:
    """What every rank measured: each stage's medians (averaged over data-parallel replicas) and each pipeline
    rank's compute order as it ran."""

    medians: Medians
    orders: dict[int, list[Action]]


def gather(own: Medians, *, pp_rank: int, order: Sequence[Action]) -> Gathered:
    """One ``all_gather_object`` over all ranks (a gloo group): a collective."""
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    gathered: list[Any] = [None] * dist.get_world_size()
    mine = (pp_rank, own, [(a.stage_idx, a.kind.value, a.mb_idx) for a in order])
    dist.all_gather_object(gathered, mine, group=group)
    samples: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    orders: dict[int, list[Action]] = {}
    for rank, medians, actions in gathered:
        orders.setdefault(int(rank), [Action(s, Kind(k), m) for s, k, m in actions])
        for stage, kinds in medians.items():
            for kind, seconds in kinds.items():
                samples[int(stage)][kind].append(float(seconds))
    merged = {s: {k: statistics.mean(v) for k, v in kinds.items()} for s, kinds in samples.items()}
    return Gathered(merged, orders)


def schedule_as_ran(orders: Mapping[int, Sequence[Action]], name: str) -> Schedule | None:
    """The whole schedule from every pipeline rank's order as it ran; None when it does not hold together
    (:func:`pipefill.schedules.validate.validate_schedule`)."""
    if sorted(orders) != list(range(len(orders))) or not all(orders.values()):
        return None
    placement: dict[int, int] = {}
    for r, actions in orders.items():
        for a in actions:
            if placement.setdefault(a.stage_idx, r) != r:
                return None
    if sorted(placement) != list(range(len(placement))):
        return None
    microbatches = 1 + max(a.mb_idx for actions in orders.values() for a in actions)
    ranks = [orders[r] for r in range(len(orders))]
    schedule = Schedule.from_orders(name, ranks, [placement[s] for s in range(len(placement))], microbatches)
    try:
        validate_schedule(schedule)
    except ScheduleError:
        return None
    return schedule


def predict_slots(schedule: Schedule | None, pp_rank: int, medians: Mapping[int, Mapping[str, float]]) -> Prediction:
    """Simulate ``schedule`` when every stage has costs; else no slots yet (the announcer makes one of every wait
    it measures and learns its length)."""
    if schedule is None:
        return Prediction({}, "learned", "the ranks' orders do not form a schedule the simulator can run")
    missing = [s for s in range(schedule.num_stages) if s not in medians]
    if missing:
        return Prediction({}, "learned", f"no measured costs for stages {missing}")
    per_stage = {s: dict(medians[s]) for s in range(schedule.num_stages)}
    profile = build_profile(per_stage, num_stages=schedule.num_stages)
    profile["schedule"] = schedule.name
    timeline = simulate(schedule, Costs.from_profile(profile), validate=False)
    return Prediction(slots_from(timeline, pp_rank, schedule.ranks[pp_rank]), "simulated", "", profile, timeline)
