"""The training loop of one rank over its parts (:mod:`pipefill_trainer.runtime`): steps, the switch from profiling
to announcing bubbles, checkpoints, metrics and event records.

A step: the executor runs the rank's actions (bubbles inside it open and close around receive waits), then the
end-of-step bubble spans the peers' step-end exchange (:meth:`pipefill_trainer.peers.Peers.step_end`: draining
sends, the data-parallel gradient all-reduce and one all-reduce of [grad-norm², loss, stop]); then clipping and
AdamW. On CUDA that bubble begins when the GPU has run the step's actions and ends when the all-reduce has completed on
it (:mod:`pipefill_trainer.devsync`). The stop flag makes a SIGTERM on any rank a job-wide, agreed stop after a
checkpoint.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipefill.events import ActionEvent, BubbleEvent, RestartEvent, StepEvent
from pipefill_trainer import checkpoint as ckpt
from pipefill_trainer import reshard
from pipefill_trainer.baseline import NoFillSteps
from pipefill_trainer.channel_link import free_bytes_fn
from pipefill_trainer.config import ConfigError
from pipefill_trainer.failure import EXIT_SIGTERM
from pipefill_trainer.hf import HuggingFaceProvider
from pipefill_trainer.hf_export import export_pretrained
from pipefill_trainer.instrument import BubbleAnnouncer, stage_medians
from pipefill_trainer.profile import own_stage_profiles, predict
from pipefill_trainer.runtime import RankParts, checkpoint_root

__all__ = ["StepResult", "Trainer"]


@dataclass(frozen=True)
class StepResult:
    loss: float
    """mean over the global batch"""
    step_s: float
    stop: bool
    """a rank asked to stop (SIGTERM): save and end"""


class Trainer:
    """Runs steps over a rank's :class:`~pipefill_trainer.runtime.RankParts` (built by ``build_rank``)."""

    def __init__(self, parts: RankParts) -> None:
        self.parts = parts
        self.announcer: BubbleAnnouncer | None = None
        """set once the profile is simulated; until then steps are profiled, bubbles only measured"""
        self.start_step = 0
        self.losses: dict[int, float] = {}
        self._durations: list[list[float]] = []
        self._stop = False
        self.nofill = NoFillSteps(
            parts.metrics,
            producer=parts.producer,
            channel_dir=parts.cfg.channel_dir,
            every_steps=parts.cfg.baseline_every_steps,
        )
        """the no-fill baseline step time (pipefill_trainer_baseline_step_seconds)"""

    @property
    def waiting_what(self) -> str | None:
        """What the rank waits for right now (for the message when a peer fails)."""
        return self.parts.pipeline.executor.waiting_what

    # --- checkpoint -------------------------------------------------------------------------------------------
    def resume(self) -> None:
        p = self.parts
        root = checkpoint_root(p.cfg)
        step = ckpt.latest_step(root)
        if step is None:
            return
        saved, now = reshard.read_layout(root, step), self._layout()
        resharded = saved is not None and saved != now
        if ckpt.is_dcp(root, step):
            try:
                state = ckpt.load_dcp(
                    root,
                    step=step,
                    rank=None if resharded else p.cfg.rank,
                    model=self._one_model(),
                    optimizer=p.optimizer,
                    map_location=p.device,
                    aliases=self._tied_aliases(),
                )
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        else:
            if saved is not None and (refused := reshard.refusal(saved, now, checkpoint=root)):
                raise ConfigError(refused)
            state = ckpt.load_rank(root, step=step, rank=p.cfg.rank, map_location=p.device)
            for s, module in p.pipeline.stages.items():
                module.load_state_dict(state["stages"][s])
            p.optimizer.load_state_dict(state["optimizer"])
        if "rng" in state:
            ckpt.set_rng_state(state["rng"])
        self.start_step = step
        p.events.write(RestartEvent(step=step, checkpoint=str(root)))
        if saved is not None and resharded:
            p.log(
                f"resumed from {root} at step {step}, resharded from {saved.num_stages} stages "
                f"{list(saved.layers_per_stage)} on {saved.world_size} ranks onto {now.num_stages} stages "
                f"{list(now.layers_per_stage)} on {now.world_size} ranks (RNG states start afresh)"
            )
        else:
            p.log(f"resumed from {root} at step {step}")

    def _layout(self) -> reshard.Layout:
        p = self.parts
        return reshard.Layout(layers_per_stage=tuple(len(r) for r in p.layer_ranges), world_size=p.cfg.job.world_size)

    def _tied_aliases(self) -> dict[str, list[str]]:
        """Each tied parameter's name → the other names of its tie (a checkpoint may hold it under one of them)."""
        out: dict[str, list[str]] = {}
        for tie in self.parts.model.tied_parameters(self.parts.pipeline.schedule.num_stages):
            names = list(dict.fromkeys(tie.names.values()))
            for name in names:
                out.setdefault(name, []).extend(n for n in names if n != name)
        return out

    def _one_model(self) -> torch.nn.Module:
        """This rank's stages as one module under the whole model's parameter names (for the ``dcp`` format)."""
        return ckpt.by_name(self.parts.pipeline.named_parameters())

    def save(self, step: int) -> None:
        p = self.parts
        root = checkpoint_root(p.cfg)
        if p.checkpoint_format == "dcp":
            extra = {"rng": ckpt.rng_state(), "data_position": step}
            ckpt.save_dcp(root, step=step, rank=p.cfg.rank, model=self._one_model(), optimizer=p.optimizer, extra=extra)
        else:
            state = {
                "stages": {s: m.state_dict() for s, m in p.pipeline.stages.items()},
                "optimizer": p.optimizer.state_dict(),
                "rng": ckpt.rng_state(),
                "data_position": step,
            }
            ckpt.save_rank(root, step=step, rank=p.cfg.rank, state=state)
        p.peers.barrier()
        if p.cfg.rank == 0:
            reshard.write_layout(root, step, self._layout())  # before latest names the step
            ckpt.write_latest(root, step)

    # --- the loop ---------------------------------------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def train(self) -> int:
        """Run the remaining steps; returns the exit code (0 done, 143 stopped by SIGTERM after a checkpoint)."""
        signal.signal(signal.SIGTERM, self.request_stop)
        cfg, interval = self.parts.cfg, self.parts.cfg.job.spec.checkpoint.interval_steps
        self.parts.watchdog.start()
        for step in range(self.start_step, cfg.steps):
            result = self.step(step)
            if cfg.rank == 0 and (step % 10 == 0 or step == cfg.steps - 1):
                self.parts.log(f"step {step} loss {result.loss:.4f} step_s {result.step_s:.4f}")
            done = step + 1
            if (interval and done % interval == 0) or done == cfg.steps or result.stop:
                self.save(done)
            if result.stop:
                self.parts.log(f"stopped by SIGTERM after step {step}; checkpoint saved")
                return EXIT_SIGTERM
        self.export()
        return 0

    def export(self) -> None:
        """Rank 0 writes ``spec.model.huggingFace.exportPath`` from the last checkpoint (the other ranks are done)."""
        p = self.parts
        hf = p.cfg.job.spec.model.hugging_face
        if hf is None or hf.export_path is None or p.cfg.rank != 0 or p.peers.replay:
            return
        root = checkpoint_root(p.cfg)
        step = ckpt.latest_step(root)
        if step is None or not isinstance(p.model, HuggingFaceProvider):
            return
        export_pretrained(p.model, checkpoints=root, step=step, out_dir=Path(hf.export_path))
        p.log(f"exported the weights of step {step} to {hf.export_path} (save_pretrained layout)")

    def step(self, step: int) -> StepResult:
        """One optimizer step."""
        p = self.parts
        pipeline, executor = p.pipeline, p.pipeline.executor
        first, last = pipeline.has_first_stage(), pipeline.has_last_stage()
        pipeline.zero_grad()
        tokens = targets = None
        if first or last:  # only the ends read data
            tokens, targets = p.data.microbatches(step, dp_rank=p.topology.dp_rank, m=p.shape.microbatches)
            # the data is read on the host; the stages run on the device (a no-op on the CPU)
            tokens = [t.to(p.device, non_blocking=True) for t in tokens]
            targets = [t.to(p.device, non_blocking=True) for t in targets]
        profiling, quiet = self.announcer is None, self.nofill.quiet(step)
        if self.announcer is not None:
            self.announcer.begin_step(step, quiet=quiet)
        self.nofill.begin(quiet=quiet)
        t0 = time.monotonic_ns()
        loss_local = executor.run_step(
            tokens if first else None,
            targets if last else None,
            exact_spans=self.announcer is None,  # profiling: spans as the device ran them
        )
        end_idx = len(executor.actions)
        # the grad norm is local work when no collective changes the gradients: done before the bubble opens, so
        # the fill does not share the device with it
        local_sq_norm = None if pipeline.has_grad_collectives() else self._local_sq_norm()
        executor.hooks.wait_begin(end_idx)  # the end-of-step bubble: this rank is done, the slowest is not
        totals = p.peers.step_end(pipeline, start_ns=t0, loss=loss_local, local_sq_norm=local_sq_norm, stop=self._stop)
        executor.hooks.wait_end(end_idx)
        self.clip_and_step(step, totals.sq_norm)
        step_s = (time.monotonic_ns() - t0) / 1e9
        self.losses[step] = totals.loss
        p.watchdog.beat()
        if p.producer is not None:
            p.producer.heartbeat()
        tokens_per_step = p.shape.global_batch * p.model.seq_len
        flops = tokens_per_step * p.model.flops_per_token()
        p.metrics.observe_step(step=step, step_s=step_s, tokens=tokens_per_step, loss=totals.loss, flops=flops)
        self.nofill.end(step_s=step_s, profiling=profiling, quiet=quiet)
        self._after_step(step)
        p.events.write(
            StepEvent(step=step, loss=totals.loss, step_s=step_s, tokens_per_s=tokens_per_step / step_s, start_ns=t0)
        )
        p.events.flush()
        return StepResult(totals.loss, step_s, totals.stop)

    def _local_sq_norm(self) -> torch.Tensor:
        """The gradients' squared norm, with the device done computing it (a wait point follows)."""
        sq_norm = self.parts.pipeline.grad_sq_norm()
        self.parts.pipeline.executor.sync.drain()
        return sq_norm

    def clip_and_step(self, step: int, sq_norm: float) -> None:
        """Clip to ``spec.optimizer.gradClip`` by the global norm, set the warmed-up learning rate, AdamW."""
        opt = self.parts.cfg.job.spec.optimizer
        norm = math.sqrt(sq_norm)
        if opt.grad_clip > 0 and norm > opt.grad_clip:
            scale = opt.grad_clip / (norm + 1e-6)
            for param in self.parts.pipeline.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale)
        lr = opt.learning_rate
        if opt.warmup_steps and step < opt.warmup_steps:
            lr = opt.learning_rate * (step + 1) / opt.warmup_steps
        for group in self.parts.optimizer.param_groups:
            group["lr"] = lr
        self.parts.optimizer.step()

    # --- after a step: records, learning, the profile -------------------------------------------------------------
    def _after_step(self, step: int) -> None:
        p = self.parts
        timing, actions = p.pipeline.executor.timing, p.pipeline.executor.actions
        assert timing is not None
        if p.events.enabled:
            for idx, a in enumerate(actions):
                p.events.write(
                    ActionEvent(
                        step=step, idx=idx, action=str(a), start_ns=timing.start_ns[idx], end_ns=timing.end_ns[idx]
                    )
                )
        if self.announcer is not None:
            for rec in self.announcer.end_step():
                measured_s = (rec.end_ns - rec.start_ns) / 1e9
                p.metrics.observe_bubble(
                    kind=rec.kind, measured_s=measured_s, predicted_s=rec.predicted_s, announced=rec.announced
                )
                p.events.write(
                    BubbleEvent(
                        step=step,
                        idx=rec.action_idx,
                        kind=rec.kind,
                        start_ns=rec.start_ns,
                        end_ns=rec.end_ns,
                        predicted_s=rec.predicted_s,
                        announced=rec.announced,
                        late=rec.late,
                    )
                )
            return
        profiled = step - self.start_step
        if profiled >= 1:  # the first step after (re)start is warm-up
            self._durations.append([(e - s) / 1e9 for s, e in zip(timing.start_ns, timing.end_ns, strict=True)])
        if profiled >= p.cfg.profile_steps - 1 and self._durations:
            self.announcer = self._announce(stage_medians(actions, self._durations))

    def _announce(self, medians: dict[int, dict[str, float]]) -> BubbleAnnouncer:
        """The profile is complete: simulate the whole pipeline with every stage's costs, then announce this rank's
        predicted bubbles from the next step on."""
        p = self.parts
        own = own_stage_profiles(
            p.pipeline.stages,
            medians,
            layer_ranges=p.layer_ranges,
            p2p_bytes_per_mb=p.pipeline.executor.p2p_bytes_per_mb(),
        )
        stages = p.peers.stage_profiles(
            own, pipeline_ranks=p.topology.pipeline_ranks, layers_per_stage=[len(r) for r in p.layer_ranges]
        )
        prediction = predict(p.shape.schedule, p.topology.pp_rank, stages, replay=p.peers.replay)
        if p.cfg.out_dir is not None:
            p.cfg.out_dir.mkdir(parents=True, exist_ok=True)
            (p.cfg.out_dir / "profile.json").write_text(json.dumps(prediction.profile, indent=1))
            timeline = prediction.timeline.to_dict(with_actions=False)
            (p.cfg.out_dir / "timeline.json").write_text(json.dumps(timeline, indent=1))
        p.peers.follow(prediction.timeline, p.topology.pp_rank)
        min_ms = p.cfg.job.spec.fill.min_bubble_milliseconds  # None: the fill's floor (instrument.py)
        announcer = BubbleAnnouncer(
            actions=p.pipeline.executor.actions,
            slots=prediction.slots,
            producer=p.producer,
            min_bubble_s=None if min_ms is None else min_ms / 1000,
            free_bytes=free_bytes_fn(p.device, reserved_bytes=p.cfg.reserved_bytes),
            late_after_s=p.cfg.late_announce_s,
        )
        p.pipeline.executor.hooks = announcer
        slots = ", ".join(f"{s.kind}@{s.action_idx}={s.predicted_s * 1e3:.2f}ms" for s in prediction.slots.values())
        p.log(f"profiled; predicted step {prediction.timeline.step_s * 1e3:.1f} ms, bubbles: {slots or 'none'}")
        return announcer
