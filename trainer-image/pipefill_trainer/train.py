"""The training loop of one rank: setup, steps, profile → bubble announcements, checkpoints, metrics, events.

A step: the executor runs the rank's actions (bubbles inside it open and close around receive waits), then the
end-of-step bubble spans sends draining, the data-parallel gradient all-reduce and one all-reduce of
[grad-norm², loss, stop]; then clipping and AdamW. On CUDA that bubble begins when the GPU has run the step's actions
and ends when the all-reduce has completed on it (:mod:`pipefill_trainer.devsync`). The stop flag makes a SIGTERM on
any rank a job-wide, agreed stop after a checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

from pipefill.schedules.generators import build_schedule
from pipefill.schedules.model import Schedule
from pipefill.schedules.validate import p2p_streams
from pipefill_trainer import checkpoint as ckpt
from pipefill_trainer.channel_link import connect_producer
from pipefill_trainer.comm import DistTransport, ReplayTransport
from pipefill_trainer.config import ConfigError, TrainerConfig
from pipefill_trainer.data import TokenSource
from pipefill_trainer.devsync import WorkPending
from pipefill_trainer.events import EventLog
from pipefill_trainer.failure import EXIT_SIGTERM, PeerMonitor, Watchdog
from pipefill_trainer.instrument import BubbleAnnouncer, stage_medians
from pipefill_trainer.metrics import TrainerMetrics
from pipefill_trainer.model import GPTConfig
from pipefill_trainer.partition import analytic_costs, measure_costs, partition_layers
from pipefill_trainer.pipeline import PipelineRank, Topology
from pipefill_trainer.profile import finish_profile

__all__ = ["Trainer"]


def _schedule(cfg: TrainerConfig) -> Schedule:
    pipe = cfg.job.spec.pipeline
    v = pipe.virtual_stages if pipe.schedule != "custom" or pipe.virtual_stages > 1 else None
    try:
        return build_schedule(
            str(pipe.schedule),
            ranks=pipe.stages,
            microbatches=pipe.microbatches,
            virtual_stages=v,
            csv_text=cfg.schedule_csv,
        )
    except ValueError as exc:
        raise ConfigError(f"spec.pipeline.schedule {str(pipe.schedule)!r}: {exc}") from None


class Trainer:
    def __init__(self, cfg: TrainerConfig, *, registry: CollectorRegistry | None = None) -> None:
        self.cfg = cfg
        spec, pipe = cfg.job.spec, cfg.job.spec.pipeline
        if cfg.cpu_affinity:
            os.sched_setaffinity(0, cfg.cpu_affinity)
        self.device = torch.device(cfg.device)
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # one core plays one GPU; more threads only contend on small machines
        else:
            torch.cuda.set_device(self.device)
        self.replay = cfg.replay_stage is not None
        self.schedule = _schedule(cfg)
        layers, hidden, heads = spec.model.dims()
        self.model_cfg = GPTConfig(
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq_len=spec.model.seq_len,
            vocab_size=spec.model.vocab_size,
            tied_embeddings=spec.model.tied_embeddings,
            activation_checkpointing=pipe.activation_checkpointing,
            seed=spec.data.seed,
        )
        self.m = pipe.microbatches
        self.mb_size = pipe.global_batch // (pipe.data_parallel * self.m)
        self.topo = Topology(rank=cfg.rank, stages=pipe.stages, data_parallel=1 if self.replay else pipe.data_parallel)
        self.watchdog = Watchdog(timeout_s=cfg.comm_timeout_s + 30, rank=cfg.rank)
        if not self.replay:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            timeout = timedelta(seconds=cfg.comm_timeout_s)
            store = dist.TCPStore(  # type: ignore[attr-defined]
                cfg.master_addr, cfg.master_port, cfg.world_size, is_master=cfg.rank == 0, timeout=timeout
            )
            dist.init_process_group(backend, store=store, rank=cfg.rank, world_size=cfg.world_size, timeout=timeout)
            self.monitor: PeerMonitor | None = PeerMonitor(
                host=cfg.master_addr, port=cfg.master_port, rank=cfg.rank, world_size=cfg.world_size
            )
        else:
            self.monitor = None
        ranges = self._partition()
        if self.replay:
            self.transport: Any = ReplayTransport(device=self.device)
        else:
            self.transport = DistTransport.open(
                device=self.device,
                schedule=self.schedule,
                replicas=self.topo.replicas,
                rank=cfg.rank,
                timeout=timedelta(seconds=cfg.comm_timeout_s),
            )
        autocast = torch.bfloat16 if self.device.type == "cuda" else None
        self.pr = PipelineRank(
            cfg=self.model_cfg,
            schedule=self.schedule,
            topo=self.topo,
            layer_ranges=ranges,
            mb_size=self.mb_size,
            device=self.device,
            transport=self.transport,
            autocast_dtype=autocast,
            distributed=not self.replay,
            timeout=timedelta(seconds=cfg.comm_timeout_s),
        )
        for st in p2p_streams(self.schedule):
            if st.reordered and st.dst_rank == self.topo.pp_rank:
                self._log(f"{st}: consumed in microbatch order {st.recv_order}, posted in send order {st.send_order}")
        self.layer_ranges = ranges
        params = self.pr.parameters()
        opt = spec.optimizer
        groups: list[dict[str, Any]] = [
            {"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=opt.learning_rate,
            betas=(opt.beta1, opt.beta2),
            weight_decay=opt.weight_decay,
        )
        self.data = TokenSource(
            spec.data,
            vocab_size=spec.model.vocab_size,
            seq_len=spec.model.seq_len,
            global_batch=pipe.global_batch,
            data_parallel=self.topo.data_parallel,
        )
        self.registry = registry if registry is not None else CollectorRegistry()
        gpu_index = self.device.index or 0 if self.device.type == "cuda" else None
        self.metrics = TrainerMetrics(self.registry, device_index=gpu_index)
        TrainerMetrics.serve(cfg.metrics_port, self.registry)
        self.events = EventLog(cfg.out_dir / "events.jsonl" if cfg.out_dir else None)
        self.producer: Any = connect_producer(
            cfg, device=self.device, stage_idx=self.pr.stage_ids[0], num_stages=self.schedule.num_stages
        )
        self.announcer: BubbleAnnouncer | None = None
        self.replay_step_s = 0.0  # replay: the modeled step (the slowest rank's finish), set by the profile
        self._durations: list[list[float]] = []
        self._stop = False
        self.start_step = 0
        self.losses: dict[int, float] = {}

    def _partition(self) -> list[range]:
        """Explicit layersPerStage, else the partition saved with the checkpoints (a resumed job keeps its cut),
        else balanced by costs measured once on rank 0 and broadcast, so every rank cuts the model the same way."""
        pipe, layers, n = self.cfg.job.spec.pipeline, self.model_cfg.layers, self.schedule.num_stages
        if pipe.layers_per_stage is not None:
            return partition_layers(
                layers, n, costs=analytic_costs(self.model_cfg), layers_per_stage=pipe.layers_per_stage
            )
        saved = _ckpt_root(self.cfg) / "partition.json"
        box: list[Any] = [None]
        if self.cfg.rank == 0:
            if saved.is_file():
                box[0] = json.loads(saved.read_text())
            else:
                costs = measure_costs(self.model_cfg, mb_size=self.mb_size, device=self.device)
                box[0] = [len(r) for r in partition_layers(layers, n, costs=costs)]
                if not self.replay:
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    saved.write_text(json.dumps(box[0]))
        if not self.replay:
            dist.broadcast_object_list(box, src=0)
        return partition_layers(layers, n, costs=analytic_costs(self.model_cfg), layers_per_stage=box[0])

    # --- checkpoint -------------------------------------------------------------------------------------------
    def resume(self) -> None:
        root = _ckpt_root(self.cfg)
        step = ckpt.latest_step(root)
        if step is None:
            return
        state = ckpt.load_rank(root, step=step, rank=self.cfg.rank, map_location=self.device)
        for s, module in self.pr.stages.items():
            module.load_state_dict(state["stages"][s])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.set_rng_state(state["rng"])
        self.start_step = step
        self._log(f"resumed from {root} at step {step}")

    def save(self, step: int) -> None:
        root = _ckpt_root(self.cfg)
        state = {
            "stages": {s: m.state_dict() for s, m in self.pr.stages.items()},
            "optimizer": self.optimizer.state_dict(),
            "rng": ckpt.rng_state(),
            "data_position": step,
        }
        ckpt.save_rank(root, step=step, rank=self.cfg.rank, state=state)
        if not self.replay:
            dist.barrier()
        if self.cfg.rank == 0:
            ckpt.write_latest(root, step)

    # --- the loop ---------------------------------------------------------------------------------------------
    def _lr(self, step: int) -> float:
        opt = self.cfg.job.spec.optimizer
        if opt.warmup_steps and step < opt.warmup_steps:
            return opt.learning_rate * (step + 1) / opt.warmup_steps
        return opt.learning_rate

    def _log(self, text: str) -> None:
        prefix = "[replay] " if self.replay else ""
        print(f"{prefix}rank {self.cfg.rank}: {text}", flush=True)

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def train(self) -> int:
        """Run the remaining steps; returns the exit code (0 done, 143 stopped by SIGTERM after a checkpoint)."""
        signal.signal(signal.SIGTERM, self.request_stop)
        cfg, interval = self.cfg, self.cfg.job.spec.checkpoint.interval_steps
        self.watchdog.start()
        for step in range(self.start_step, cfg.steps):
            loss, step_s, stop = self.step(step)
            if cfg.rank == 0 and (step % 10 == 0 or step == cfg.steps - 1):
                self._log(f"step {step} loss {loss:.4f} step_s {step_s:.4f}")
            done = step + 1
            if (interval and done % interval == 0) or done == cfg.steps or stop:
                self.save(done)
            if stop:
                self._log(f"stopped by SIGTERM after step {step}; checkpoint saved")
                return EXIT_SIGTERM
        return 0

    def step(self, step: int) -> tuple[float, float, bool]:
        """One optimizer step: (loss, step seconds, stop requested by any rank)."""
        spec = self.cfg.job.spec
        tokens_per_step = spec.pipeline.global_batch * spec.model.seq_len
        first, last = self.pr.has_first_stage(), self.pr.has_last_stage()
        self.pr.zero_grad()
        tokens = targets = None
        if first or last or self.replay:
            tokens, targets = self.data.microbatches(step, dp_rank=self.topo.dp_rank, m=self.m)
        if self.announcer is not None:
            self.announcer.begin_step(step)
        self.pr.executor.exact_spans = self.announcer is None  # profiling: spans as the device ran them
        t0 = time.monotonic_ns()
        loss_local = self.pr.executor.run_step(tokens if first else None, targets if last else None)
        end_idx = len(self.pr.executor.actions)
        hooks = self.pr.executor.hooks
        # the grad norm is local work when no collective changes the gradients: done before the bubble opens, so
        # the fill does not share the device with it
        local_sq_norm = None if self.pr.has_grad_collectives() else self._local_sq_norm()
        hooks.wait_begin(end_idx)  # the end-of-step bubble: this rank is done, the slowest is not
        sq_norm, loss, stop = self._step_end(loss_local, t0, local_sq_norm)
        hooks.wait_end(end_idx)
        self._clip_and_step(step, sq_norm)
        step_s = (time.monotonic_ns() - t0) / 1e9
        self.losses[step] = loss
        self.watchdog.beat()
        if self.producer is not None:
            self.producer.heartbeat()
        flops = tokens_per_step * self.model_cfg.flops_per_token()
        self.metrics.observe_step(step=step, step_s=step_s, tokens=tokens_per_step, loss=loss, flops=flops)
        self._after_step(step)
        self.events.write(
            {
                "type": "step",
                "step": step,
                "loss": loss,
                "step_s": step_s,
                "tokens_per_s": tokens_per_step / step_s,
                "t_ns": t0,
            }
        )
        self.events.flush()
        return loss, step_s, stop

    def _local_sq_norm(self) -> torch.Tensor:
        """The gradients' squared norm, with the device done computing it (a wait point follows)."""
        sq_norm = self.pr.grad_sq_norm()
        self.pr.executor.sync.drain()
        return sq_norm

    def _step_end(self, loss_local: float, t0: int, local_sq_norm: torch.Tensor | None) -> tuple[float, float, bool]:
        """Inside the end-of-step bubble: the all-reduce of [grad norm², loss, stop]; ``local_sq_norm`` when known."""
        if self.replay:
            self.transport.flush()
            timeline_end_s = self.replay_step_s
            while time.monotonic_ns() < t0 + int(timeline_end_s * 1e9):  # the slowest rank's modeled finish
                time.sleep(min(1e-3, max(0.0, (t0 + timeline_end_s * 1e9 - time.monotonic_ns()) / 1e9)))
            sq_norm = self.pr.grad_sq_norm() if local_sq_norm is None else local_sq_norm
            return float(sq_norm), loss_local, self._stop
        ex = self.pr.executor
        ex.waiting_on, ex.waiting_what = None, "draining sends and in the step-end all-reduce"
        ex.flush_sends()
        self.pr.sync_grads()
        stats = torch.stack(
            [
                self.pr.grad_sq_norm() if local_sq_norm is None else local_sq_norm,
                torch.tensor(loss_local, dtype=torch.float32, device=self.device),
                torch.tensor(float(self._stop), device=self.device),
            ]
        )
        work = dist.all_reduce(stats, async_op=True)
        assert work is not None
        ex.sync.wait(WorkPending(work))  # on CUDA: until the GPU completed it (the slowest rank is done)
        ex.waiting_what = None
        dp = self.topo.data_parallel
        return float(stats[0]) / dp, float(stats[1]) / dp, bool(stats[2] > 0)

    def _clip_and_step(self, step: int, sq_norm: float) -> None:
        clip = self.cfg.job.spec.optimizer.grad_clip
        norm = math.sqrt(sq_norm)
        if clip > 0 and norm > clip:
            scale = clip / (norm + 1e-6)
            for p in self.pr.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        lr = self._lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()

    def _after_step(self, step: int) -> None:
        timing = self.pr.executor.timing
        assert timing is not None
        actions = self.pr.executor.actions
        if self.events.enabled:
            for idx, a in enumerate(actions):
                self.events.write(
                    {
                        "type": "action",
                        "step": step,
                        "idx": idx,
                        "action": str(a),
                        "start_ns": timing.start_ns[idx],
                        "end_ns": timing.end_ns[idx],
                    }
                )
        if self.announcer is not None:
            for rec in self.announcer.end_step():
                measured_s = (rec.end_ns - rec.start_ns) / 1e9
                self.metrics.observe_bubble(
                    kind=rec.kind, measured_s=measured_s, predicted_s=rec.predicted_s, announced=rec.announced
                )
                self.events.write(
                    {
                        "type": "bubble",
                        "step": step,
                        "idx": rec.action_idx,
                        "kind": rec.kind,
                        "start_ns": rec.start_ns,
                        "end_ns": rec.end_ns,
                        "predicted_s": rec.predicted_s,
                        "announced": rec.announced,
                    }
                )
            return
        profiled = step - self.start_step
        if profiled >= 1:  # the first step after (re)start is warm-up
            self._durations.append([(e - s) / 1e9 for s, e in zip(timing.start_ns, timing.end_ns, strict=True)])
        if profiled >= self.cfg.profile_steps - 1 and self._durations:
            medians = stage_medians(actions, self._durations)
            self.announcer = finish_profile(self, medians)


def _ckpt_root(cfg: TrainerConfig) -> Path:
    return Path(cfg.job.spec.checkpoint.path)
