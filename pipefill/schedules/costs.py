"""Action costs for the timeline simulator: uniform units, a measured profile, or an analytic model.

Per-stage tuples hold one value per stage; a tuple of length 1 applies to every stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.schedules.model import Kind

__all__ = ["Costs", "per_stage"]


def per_stage(values: Sequence[float], stage_idx: int, field: str) -> float:
    """``values[stage_idx]``, or ``values[0]`` when one value is given for all stages."""
    if len(values) == 1:
        return values[0]
    if not 0 <= stage_idx < len(values):
        raise ValueError(
            f"{field} has {len(values)} per-stage values but stage {stage_idx} was asked for; "
            "give one value per stage or a single value for all"
        )
    return values[stage_idx]


@dataclass(frozen=True)
class Costs:
    """Seconds each action takes, per stage, and what moving data between ranks costs."""

    f_s: tuple[float, ...]
    """forward seconds per stage per microbatch"""
    b_s: tuple[float, ...]
    """full-backward seconds per stage per microbatch (usually ≈ ``i_s + w_s``)"""
    i_s: tuple[float, ...]
    """input-gradient backward seconds per stage per microbatch"""
    w_s: tuple[float, ...]
    """weight-gradient backward seconds per stage per microbatch"""
    p2p_bytes: tuple[float, ...] = (0.0,)
    """bytes a stage sends to the next per microbatch (activations forward, the same size of gradient back); default 0"""
    p2p_latency_s: float = 0.0
    """fixed cost of one send between two ranks, seconds; default 0; same-rank hand-offs are free"""
    p2p_bandwidth_bytes_per_s: float = math.inf
    """point-to-point bandwidth between neighbouring ranks, bytes/s; default unlimited"""
    step_end_s: float = 0.0
    """seconds each rank spends after its last action on the data-parallel gradient all-reduce and the optimizer
    step; default 0. The device is busy during it, so it is not a bubble."""

    def action_s(self, kind: Kind, stage_idx: int) -> float:
        values = {Kind.F: self.f_s, Kind.B: self.b_s, Kind.I: self.i_s, Kind.W: self.w_s}[kind]
        return per_stage(values, stage_idx, f"{kind.value.lower()}_s")

    def p2p_s(self, stage_idx: int) -> float:
        """Seconds from the end of ``stage_idx``'s F (or its successor's B/I) until the peer can use the data."""
        size = per_stage(self.p2p_bytes, stage_idx, "p2p_bytes")
        return self.p2p_latency_s + (size / self.p2p_bandwidth_bytes_per_s if size else 0.0)

    @classmethod
    def uniform(cls, *, f_s: float = 1.0, i_s: float = 1.0, w_s: float = 1.0) -> Costs:
        """Every stage: F = I = W = 1 unit, full backward B = I + W = 2 units, free communication, no step end.

        This is the zero-bubble paper's "F = B = W" (its B is our input-gradient backward I); under it the
        GPipe/1F1B bubble fraction is exactly (p − 1)/(m + p − 1).
        """
        return cls(f_s=(f_s,), b_s=(i_s + w_s,), i_s=(i_s,), w_s=(w_s,))

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | str) -> Costs:
        """Build from the profile JSON the trainer writes (a dict, or its text); schema in ``docs/schedules.md``."""
        data = json.loads(profile) if isinstance(profile, str) else profile
        stages = _stages(data)
        f, b, i, w, sizes = [], [], [], [], []
        for pos, stage in enumerate(stages):
            med = stage.get("median_s")
            where = f"profile stages[{pos}]"
            if not isinstance(med, Mapping):
                raise ValueError(f"{where}.median_s must be an object of action kind -> seconds, got {med!r}")
            f.append(_seconds(med, "F", where))
            has_split = "I" in med and "W" in med
            if "B" not in med and not has_split:
                raise ValueError(f"{where}.median_s needs 'B' or both 'I' and 'W' (seconds), got keys {sorted(med)}")
            b_val = _seconds(med, "B", where) if "B" in med else _seconds(med, "I", where) + _seconds(med, "W", where)
            b.append(b_val)
            # a profile of a full-backward run has no split; assume the zero-bubble paper's even split
            i.append(_seconds(med, "I", where) if has_split else b_val / 2)
            w.append(_seconds(med, "W", where) if has_split else b_val / 2)
            sizes.append(float(stage.get("p2p_bytes_per_mb", 0)))
        p2p = data.get("p2p", {})
        return cls(
            f_s=tuple(f),
            b_s=tuple(b),
            i_s=tuple(i),
            w_s=tuple(w),
            p2p_bytes=tuple(sizes),
            p2p_latency_s=float(p2p.get("latency_s", 0.0)),
            p2p_bandwidth_bytes_per_s=float(p2p.get("bandwidth_bytes_per_s", math.inf)),
            step_end_s=float(data.get("step_end_s", 0.0)),
        )

    @classmethod
    def analytic(
        cls,
        *,
        params: float,
        tokens_per_mb: int,
        stages: int,
        device_tflops: float,
        layers: int | None = None,
        hidden_size: int | None = None,
        mfu: float = 0.45,
        tensor_parallel: int = 1,
        data_parallel: int = 1,
        virtual_stages: int = 1,
        activation_checkpointing: bool = False,
        p2p_bandwidth_bytes_per_s: float = 50e9,
        p2p_latency_s: float = 20e-6,
        dp_bandwidth_bytes_per_s: float = 50e9,
        hbm_bandwidth_bytes_per_s: float = 3.35e12,
        bytes_per_element: int = 2,
    ) -> Costs:
        """The 6·N·T rule: forward 2·N·T flops, backward 4·N·T (input and weight gradients 2·N·T each), per stage.

        ``params`` N (all stages), ``tokens_per_mb`` T, ``stages`` (p × v), ``device_tflops`` peak dense TFLOP/s of
        one device, ``mfu`` the fraction of peak reached (default 0.45). ``layers`` spreads N over stages by whole
        layers (default: evenly). ``tensor_parallel`` devices share each stage's flops; a rank holds
        ``virtual_stages`` stages. Activation checkpointing adds a recomputed forward to every backward. P2P sends
        ``tokens_per_mb × hidden_size`` elements (needs ``hidden_size``; else free). Step end: ring all-reduce of the
        rank's bf16 gradients over ``data_parallel`` replicas plus an Adam step reading and writing 16 bytes per
        parameter from HBM. Bandwidths in bytes/s, latency in seconds.
        """
        for field, value in (
            ("params", params),
            ("tokens_per_mb", tokens_per_mb),
            ("stages", stages),
            ("device_tflops", device_tflops),
            ("mfu", mfu),
            ("tensor_parallel", tensor_parallel),
            ("data_parallel", data_parallel),
            ("virtual_stages", virtual_stages),
        ):
            if not value > 0:
                raise ValueError(f"{field} must be > 0, got {value!r}")
        shares = _layer_shares(stages, layers)
        flops_per_s = device_tflops * 1e12 * mfu * tensor_parallel
        f = tuple(2 * params * sh * tokens_per_mb / flops_per_s for sh in shares)
        recompute = f if activation_checkpointing else tuple(0.0 for _ in f)
        b = tuple(2 * x + r for x, r in zip(f, recompute, strict=True))
        i = tuple(x + r for x, r in zip(f, recompute, strict=True))
        w = f
        size = float(tokens_per_mb * hidden_size * bytes_per_element / tensor_parallel) if hidden_size else 0.0
        params_per_device = params * max(shares) * virtual_stages / tensor_parallel
        ring = 2 * (data_parallel - 1) / data_parallel
        allreduce_s = ring * params_per_device * bytes_per_element / dp_bandwidth_bytes_per_s
        optimizer_s = params_per_device * 16 * 2 / hbm_bandwidth_bytes_per_s
        return cls(
            f_s=f,
            b_s=b,
            i_s=i,
            w_s=w,
            p2p_bytes=(size,),
            p2p_latency_s=p2p_latency_s,
            p2p_bandwidth_bytes_per_s=p2p_bandwidth_bytes_per_s,
            step_end_s=allreduce_s + optimizer_s,
        )


def _layer_shares(stages: int, layers: int | None) -> list[float]:
    """Fraction of the model's parameters on each stage: whole layers, the first stages take the remainder."""
    if layers is None:
        return [1 / stages] * stages
    if layers < stages:
        raise ValueError(
            f"layers={layers} < stages={stages}: every stage needs at least one layer; "
            "use fewer stages or virtual stages"
        )
    base, extra = divmod(layers, stages)
    return [(base + (1 if s < extra else 0)) / layers for s in range(stages)]


def _stages(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ValueError("profile 'stages' must be a non-empty list with one object per stage, in stage order")
    for pos, stage in enumerate(stages):
        if not isinstance(stage, Mapping) or stage.get("stage_idx", pos) != pos:
            raise ValueError(f"profile stages[{pos}] must be an object with stage_idx {pos} (stages in order)")
    return stages


def _seconds(med: Mapping[str, Any], kind: str, where: str) -> float:
    value = med.get(kind)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{where}.median_s.{kind} must be seconds >= 0, got {value!r}")
    return float(value)
