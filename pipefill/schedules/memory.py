"""Device memory of a rank over the step: static memory plus the activations of in-flight microbatches.

A microbatch is *in flight* on a stage from the start of its ``F`` until the end of its ``B`` (or of its ``W`` with a
split backward: the weight gradient still reads the saved activations). The free memory during a bubble is
``device_bytes − reserve_bytes − Σ static_bytes − Σ in_flight × per-microbatch bytes`` over the rank's stages, where
the per-microbatch bytes are the activations, or with activation checkpointing only the stage input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.schedules.costs import per_stage
from pipefill.schedules.model import Action, Kind

__all__ = ["MemoryModel", "in_flight_after", "peak_in_flight"]

_GIB = 1 << 30


def releases(action: Action) -> bool:
    """Does finishing ``action`` free its microbatch's activations? (B, or W of a split backward.)"""
    return action.kind is Kind.B or action.kind is Kind.W


def in_flight_after(actions: Sequence[Action]) -> list[dict[int, int]]:
    """In-flight microbatches per stage after each prefix: element ``k`` is the count before ``actions[k]`` runs."""
    counts: dict[int, int] = {}
    out = [dict(counts)]
    for a in actions:
        if a.kind is Kind.F:
            counts[a.stage_idx] = counts.get(a.stage_idx, 0) + 1
        elif releases(a):
            counts[a.stage_idx] -= 1
        out.append(dict(counts))
    return out


def peak_in_flight(actions: Sequence[Action]) -> int:
    """Most microbatches (summed over the rank's stages) holding activations at once, counting an F from its start."""
    count = peak = 0
    for a in actions:
        if a.kind is Kind.F:
            count += 1
            peak = max(peak, count)
        elif releases(a):
            count -= 1
    return peak


@dataclass(frozen=True)
class MemoryModel:
    """What one device holds. Per-stage tuples: one value per stage, or one value for every stage."""

    device_bytes: int
    """usable memory of one device, bytes (e.g. 80 GiB on an H100 SXM)"""
    static_bytes: tuple[int, ...]
    """per stage: weights, gradients and optimizer state that stay for the whole step, bytes"""
    activation_bytes_per_mb: tuple[int, ...]
    """per stage: activations one microbatch leaves between its F and its B/W, without checkpointing, bytes"""
    input_bytes_per_mb: tuple[int, ...] = (0,)
    """per stage: the stage input one microbatch keeps under activation checkpointing, bytes; default 0"""
    activation_checkpointing: bool = False
    """keep only stage inputs between F and B (recomputing the rest in B); default off"""
    reserve_bytes: int = 2 * _GIB
    """never offered to fill work: CUDA context, NCCL buffers, allocator fragmentation, bytes; default 2 GiB"""

    def per_mb_bytes(self, stage_idx: int) -> int:
        values = self.input_bytes_per_mb if self.activation_checkpointing else self.activation_bytes_per_mb
        return int(per_stage(values, stage_idx, "bytes per microbatch"))

    def used_bytes(self, stages: Sequence[int], in_flight: Mapping[int, int]) -> int:
        """Bytes the training holds on a rank with ``stages`` and ``in_flight[stage]`` microbatches in flight."""
        static = sum(int(per_stage(self.static_bytes, s, "static_bytes")) for s in stages)
        return static + sum(n * self.per_mb_bytes(s) for s, n in in_flight.items())

    def free_bytes(self, stages: Sequence[int], in_flight: Mapping[int, int]) -> int:
        """Bytes fill work may use (never below 0)."""
        return max(0, self.device_bytes - self.reserve_bytes - self.used_bytes(stages, in_flight))

    @classmethod
    def from_profile(
        cls, profile: Mapping[str, Any] | str, *, activation_checkpointing: bool = False, reserve_bytes: int = 2 * _GIB
    ) -> MemoryModel:
        """Build from the trainer's profile JSON (``device_bytes`` and per-stage bytes; see ``docs/schedules.md``)."""
        data = json.loads(profile) if isinstance(profile, str) else profile
        device = data.get("device_bytes")
        if isinstance(device, bool) or not isinstance(device, int) or device <= 0:
            raise ValueError(f"profile device_bytes must be a positive integer (bytes), got {device!r}")
        stages = data.get("stages") or []
        if not stages:
            raise ValueError("profile 'stages' must be a non-empty list with one object per stage")

        def column(key: str, default: int | None) -> tuple[int, ...]:
            values = []
            for pos, stage in enumerate(stages):
                value = stage.get(key, default)
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"profile stages[{pos}].{key} must be bytes (an integer >= 0), got {value!r}")
                values.append(value)
            return tuple(values)

        return cls(
            device_bytes=device,
            static_bytes=column("static_bytes", None),
            activation_bytes_per_mb=column("activation_bytes_per_mb", None),
            input_bytes_per_mb=column("input_bytes_per_mb", 0),
            activation_checkpointing=activation_checkpointing,
            reserve_bytes=reserve_bytes,
        )

    @classmethod
    def analytic(
        cls,
        *,
        params: float,
        stages: int,
        layers: int,
        hidden_size: int,
        tokens_per_mb: int,
        device_bytes: int,
        tensor_parallel: int = 1,
        activation_checkpointing: bool = False,
        reserve_bytes: int = 2 * _GIB,
    ) -> MemoryModel:
        """Mixed-precision Adam without sharding: 16 bytes per parameter (bf16 weights and gradients, fp32 master
        weights and two moments), split over ``tensor_parallel``; activations 34 bytes per token per hidden unit per
        layer (Korthikanti et al. 2022, flash attention, sequence parallel), the stage input 2 bytes per token per
        hidden unit. Layers are spread over stages as in :meth:`Costs.analytic`.
        """
        if layers < stages:
            raise ValueError(f"layers={layers} < stages={stages}: every stage needs at least one layer")
        base, extra = divmod(layers, stages)
        per_stage_layers = [base + (1 if s < extra else 0) for s in range(stages)]
        static = tuple(int(params * n / layers * 16 / tensor_parallel) for n in per_stage_layers)
        acts = tuple(int(34 * tokens_per_mb * hidden_size * n / tensor_parallel) for n in per_stage_layers)
        inputs = (int(2 * tokens_per_mb * hidden_size / tensor_parallel),)
        return cls(device_bytes, static, acts, inputs, activation_checkpointing, reserve_bytes)
