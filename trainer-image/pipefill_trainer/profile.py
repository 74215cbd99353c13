"""From the profiled steps to bubble announcements: gather the pipeline's action costs, simulate, connect the channel.

Every rank measured only its own stages; the medians are gathered over the job so every rank simulates the same
whole-pipeline timeline. In replay mode there are no peers: the parts of the model (a block, the embeddings, the
head with the loss) are timed forward and backward on this device, and a modeled stage costs the sum of its parts
scaled by how this rank's own stages compared with the sum of theirs (per action kind) — so a last stage with a large
vocabulary head costs what it would. The timeline also gives the absolute times at which the replayed peers' data
"arrives".
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipefill.schedules.costs import Costs
from pipefill.schedules.simulate import simulate
from pipefill_trainer.instrument import BubbleAnnouncer, Slot, build_profile
from pipefill_trainer.partition import PartSeconds, measure_parts

if TYPE_CHECKING:
    from pipefill_trainer.train import Trainer

__all__ = ["finish_profile", "model_peer_medians"]

_GPU_SAFETY_BYTES = 512 * 2**20  # never offered: the trainer's allocator may still grow a little inside a bubble


def _stage_extra(trainer: Trainer) -> dict[int, dict[str, Any]]:
    cfg = trainer.model_cfg
    extra = {}
    for s, module in trainer.pr.stages.items():
        param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
        extra[s] = {
            "static_bytes": 4 * param_bytes,  # weights, gradients, two AdamW moments
            "p2p_bytes_per_mb": trainer.mb_size * cfg.seq_len * cfg.hidden * 4,
            "layers": len(trainer.layer_ranges[s]),
        }
    return extra


def finish_profile(trainer: Trainer, medians: dict[int, dict[str, float]]) -> BubbleAnnouncer:
    """Build the profile JSON, this rank's bubble slots, and the announcer (installed as the executor's hooks)."""
    schedule, pp_rank = trainer.schedule, trainer.topo.pp_rank
    mine = {"medians": medians, "extra": _stage_extra(trainer)}
    gathered: list[Any] = [mine]
    if not trainer.replay:
        gathered = [None] * trainer.cfg.world_size
        dist.all_gather_object(gathered, mine)
        gathered = [gathered[r] for r in trainer.topo.pipeline_ranks]
    per_stage: dict[int, dict[str, float]] = {}
    extra: dict[int, dict[str, Any]] = {}
    for entry in gathered:
        assert entry is not None
        per_stage.update(entry["medians"])
        extra.update(entry["extra"])
    if trainer.replay:
        parts = measure_parts(trainer.model_cfg, mb_size=trainer.mb_size, device=trainer.device)
        layers = [len(r) for r in trainer.layer_ranges]
        per_stage = model_peer_medians(per_stage, parts=parts, layers_per_stage=layers)
        own_extra = next(iter(extra.values()))
        for s in range(schedule.num_stages):
            extra.setdefault(s, {**own_extra, "layers": layers[s]})
    profile = build_profile(per_stage, num_stages=schedule.num_stages, extra=extra)
    profile["schedule"] = schedule.name
    profile["replay"] = trainer.replay
    timeline = simulate(schedule, Costs.from_profile(profile), validate=False)
    if trainer.cfg.out_dir is not None:
        trainer.cfg.out_dir.mkdir(parents=True, exist_ok=True)
        (trainer.cfg.out_dir / "profile.json").write_text(json.dumps(profile, indent=1))
        (trainer.cfg.out_dir / "timeline.json").write_text(json.dumps(timeline.to_dict(with_actions=False), indent=1))
    actions = schedule.ranks[pp_rank]
    slots = {}
    for b in timeline.bubbles(pp_rank):
        mb = actions[b.before_action_idx].mb_idx if b.before_action_idx < len(actions) else -1
        slots[b.before_action_idx] = Slot(b.before_action_idx, b.kind, b.duration_s, mb)
    if trainer.replay:
        spans = timeline.ranks[pp_rank].actions
        trainer.transport.release_s = {i: spans[i].start_s for i in range(len(spans))}
        trainer.replay_step_s = timeline.step_s
    producer = trainer.producer
    announcer = BubbleAnnouncer(
        actions=actions,
        slots=slots,
        producer=producer,
        min_bubble_s=trainer.cfg.job.spec.fill.min_bubble_milliseconds / 1000,
        free_bytes=_free_bytes_fn(trainer),
    )
    trainer.pr.executor.hooks = announcer
    predicted = ", ".join(f"{s.kind}@{s.action_idx}={s.predicted_s * 1e3:.2f}ms" for s in slots.values())
    trainer._log(f"profiled; predicted step {timeline.step_s * 1e3:.1f} ms, bubbles: {predicted or 'none'}")
    return announcer


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


def _free_bytes_fn(trainer: Trainer) -> Any:
    reserved = trainer.cfg.reserved_bytes
    if trainer.device.type == "cuda":
        device = trainer.device

        def gpu_free() -> int:
            free, _ = torch.cuda.mem_get_info(device)
            return max(0, min(free - _GPU_SAFETY_BYTES, free))

        return gpu_free
    return lambda: reserved  # CPU: the configured budget (spec.fill.reservedMemory)
