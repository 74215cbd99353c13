"""From the profiled steps to the predicted bubbles: every stage's costs → the profile JSON → the simulated timeline →
this rank's bubble slots. Returned as a :class:`Prediction`; the trainer installs the announcer and the peers follow
the timeline (replay), nothing here changes them.

Every rank measures only its own stages; :meth:`pipefill_trainer.peers.Peers.stage_profiles` makes them the whole
pipeline's (gathered from the live peers, or modeled in replay mode by :func:`model_peer_medians`), so every rank
simulates the same timeline.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from pipefill.schedules.costs import Costs
from pipefill.schedules.model import Schedule
from pipefill.schedules.simulate import simulate
from pipefill.schedules.timeline import Timeline
from pipefill_trainer.instrument import Slot, build_profile, slots_from
from pipefill_trainer.partition import PartSeconds

__all__ = [
    "Prediction",
    "StageProfile",
    "model_peer_medians",
    "modeled_stage_profiles",
    "own_stage_profiles",
    "predict",
]


@dataclass(frozen=True)
class StageProfile:
    """One stage's measured costs and what the memory model needs of it."""

    median_s: dict[str, float]
    """median seconds per action kind (``F``, ``B``, ``I``, ``W``) over the profiled steps"""
    static_bytes: int
    """weights, gradients and the two AdamW moments"""
    p2p_bytes_per_mb: int
    """one microbatch's activations between stages (the model provider's, across the widest stage edge)"""
    layers: int


@dataclass(frozen=True)
class Prediction:
    """The profile JSON (``Costs.from_profile``'s schema), its simulated timeline, and this rank's bubble slots by the
    index of the action each bubble precedes (``len(actions)``: the end of the step)."""

    profile: dict[str, Any]
    timeline: Timeline
    slots: dict[int, Slot]


def own_stage_profiles(
    stages: Mapping[int, torch.nn.Module],
    medians: Mapping[int, dict[str, float]],
    *,
    layer_ranges: Sequence[range],
    p2p_bytes_per_mb: int,
) -> dict[int, StageProfile]:
    """This rank's stages: their measured medians and sizes."""
    out = {}
    for s, module in stages.items():
        param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
        out[s] = StageProfile(dict(medians[s]), 4 * param_bytes, p2p_bytes_per_mb, len(layer_ranges[s]))
    return out


def predict(schedule: Schedule, pp_rank: int, stages: Mapping[int, StageProfile], *, replay: bool) -> Prediction:
    """Simulate ``schedule`` with every stage's costs; ``pp_rank``'s bubbles become its slots."""
    per_stage = {s: p.median_s for s, p in stages.items()}
    extra = {s: {"static_bytes": p.static_bytes, "p2p_bytes_per_mb": p.p2p_bytes_per_mb, "layers": p.layers}
             for s, p in stages.items()}  # fmt: skip
    profile = build_profile(per_stage, num_stages=schedule.num_stages, extra=extra)
    profile["schedule"] = schedule.name
    profile["replay"] = replay
    timeline = simulate(schedule, Costs.from_profile(profile), validate=False)
    return Prediction(profile, timeline, slots_from(timeline, pp_rank, schedule.ranks[pp_rank]))


def modeled_stage_profiles(
    own: Mapping[int, StageProfile], *, parts: PartSeconds, layers_per_stage: Sequence[int]
) -> dict[int, StageProfile]:
    """Every stage's profile from this rank's ``own`` (kept as measured): the others' medians modeled
    (:func:`model_peer_medians`), their sizes this rank's with their own layer count."""
    medians = model_peer_medians(
        {s: p.median_s for s, p in own.items()}, parts=parts, layers_per_stage=layers_per_stage
    )
    template = next(iter(own.values()))
    return {
        s: own[s] if s in own else replace(template, median_s=medians[s], layers=layers_per_stage[s])
        for s in range(len(layers_per_stage))
    }


def model_peer_medians(
    own: dict[int, dict[str, float]], *, parts: PartSeconds, layers_per_stage: Sequence[int]
) -> dict[int, dict[str, float]]:
    """Median seconds per action kind of every stage, given this rank's ``own`` stages (kept as measured).

    Another stage costs the sum of its parts (``layers_per_stage[s]`` blocks, the embeddings on stage 0, the head
    with the loss on the last; forward parts for ``F``, backward parts for ``B``, ``I`` and ``W``) times how this
    rank's measured medians compare with the sums of their own parts (the mean ratio over its stages, per kind).
    """
    n = len(layers_per_stage)

    def parts_s(s: int, kind: str) -> float:
        c = parts.forward if kind == "F" else parts.backward
        return layers_per_stage[s] * c.block + (c.embed if s == 0 else 0.0) + (c.head if s == n - 1 else 0.0)

    kinds = {k for med in own.values() for k in med}
    scale = {k: statistics.mean(med[k] / parts_s(s, k) for s, med in own.items() if k in med) for k in kinds}
    return {s: dict(own[s]) if s in own else {k: f * parts_s(s, k) for k, f in scale.items()} for s in range(n)}
