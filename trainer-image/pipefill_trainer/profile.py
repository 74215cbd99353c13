"""From the profiled steps to bubble announcements: gather the pipeline's action costs, simulate, connect the channel.

Every rank measured only its own stages; the medians are gathered over the job so every rank simulates the same
whole-pipeline timeline. In replay mode there are no peers: every stage of the modeled pipeline is assumed to cost
what this rank's stages cost (their mean per action kind), and the timeline also gives the absolute times at which
the replayed peers' data "arrives".
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipefill.schedules.costs import Costs
from pipefill.schedules.simulate import simulate
from pipefill_trainer.instrument import BubbleAnnouncer, Slot, build_profile

if TYPE_CHECKING:
    from pipefill_trainer.train import Trainer

__all__ = ["finish_profile"]

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
    if trainer.replay:
        gathered = [mine]
    else:
        gathered = [None] * trainer.cfg.world_size
        dist.all_gather_object(gathered, mine)
        gathered = [gathered[r] for r in trainer.topo.pipeline_ranks]
    per_stage: dict[int, dict[str, float]] = {}
    extra: dict[int, dict[str, Any]] = {}
    for entry in gathered:
        assert entry is not None
        per_stage.update(entry["medians"])
        extra.update(entry["extra"])
    if trainer.replay:  # modeled peers cost what our own stages cost
        kinds = {k for med in per_stage.values() for k in med}
        mean = {k: statistics.mean(med[k] for med in per_stage.values() if k in med) for k in kinds}
        for s in range(schedule.num_stages):
            per_stage.setdefault(s, dict(mean))
            extra.setdefault(s, next(iter(extra.values())))
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


def _free_bytes_fn(trainer: Trainer) -> Any:
    reserved = trainer.cfg.reserved_bytes
    if trainer.device.type == "cuda":
        device = trainer.device

        def gpu_free() -> int:
            free, _ = torch.cuda.mem_get_info(device)
            return max(0, min(free - _GPU_SAFETY_BYTES, free))

        return gpu_free
    return lambda: reserved  # CPU: the configured budget (spec.fill.reservedMemory)
