"""The other ranks of the job as this rank meets them: live processes (torch.distributed), or replayed.

Everything the trainer does with its peers goes through :class:`Peers`: the process layout, sharing the layer cut, the
point-to-point transport, the end-of-step exchange, the whole pipeline's profile, checkpoint barriers and naming a
dead peer. :class:`DistPeers` talks to the real ranks. :class:`ReplayPeers` replaces them with the modeled timeline
(``docs/trainer.md``, "Replay mode"): a receive completes at the absolute time the timeline says the peer's data
arrives, the step ends when the slowest modeled rank finishes, and the peers' costs are modeled from this rank's
measured parts. No other module of the trainer asks whether it replays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

from pipefill.schedules.model import Schedule
from pipefill.schedules.timeline import Timeline
from pipefill_trainer.comm import DistTransport, ReplayTransport, Transport
from pipefill_trainer.config import TrainerConfig
from pipefill_trainer.devsync import WorkPending
from pipefill_trainer.failure import PeerMonitor
from pipefill_trainer.partition import measure_parts
from pipefill_trainer.pipeline import PipelineRank, Topology
from pipefill_trainer.profile import StageProfile, modeled_stage_profiles
from pipefill_trainer.provider import ModelProvider

__all__ = ["DistPeers", "Peers", "ReplayPeers", "StepTotals", "open_peers"]

T = TypeVar("T")


@dataclass(frozen=True)
class StepTotals:
    """What the end-of-step exchange agrees on: the gradients' squared norm and the loss (both over the job's
    replicas), and whether any rank asked to stop."""

    sq_norm: float
    loss: float
    stop: bool


class Peers(Protocol):
    replay: bool
    """whether the peers are modeled (for labels and records; behaviour differs only through the methods)"""
    collectives: bool
    """whether process groups exist for data-parallel and tied-embedding gradient reductions"""
    writes_job_state: bool
    """whether this rank writes job-wide state (the saved layer cut): rank 0 of a real job"""

    def topology(self, rank: int, *, stages: int, data_parallel: int) -> Topology: ...

    def share(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0, its value on every rank."""

    def open_transport(self, schedule: Schedule, topology: Topology) -> Transport: ...

    def step_end(
        self, pipeline: PipelineRank, *, start_ns: int, loss: float, local_sq_norm: torch.Tensor | None, stop: bool
    ) -> StepTotals: ...

    def stage_profiles(
        self, own: Mapping[int, StageProfile], *, pipeline_ranks: Sequence[int], layers_per_stage: Sequence[int]
    ) -> dict[int, StageProfile]:
        """Every stage's profile, from this rank's ``own`` stages."""

    def follow(self, timeline: Timeline, pp_rank: int) -> None:
        """The predicted timeline is known (replay: it now says when peers' data arrives and when the step ends)."""

    def barrier(self) -> None: ...

    def dead_peers(self) -> list[int]:
        """Ranks that stopped answering (after a communication error)."""


class DistPeers:
    """The live ranks: a TCPStore rendezvous, one process group (NCCL on CUDA, gloo on CPU), heartbeats."""

    replay = False
    collectives = True

    def __init__(self, cfg: TrainerConfig, device: torch.device) -> None:
        self.device, self.rank, self.world_size = device, cfg.rank, cfg.world_size
        self.timeout = timedelta(seconds=cfg.comm_timeout_s)
        self.writes_job_state = cfg.rank == 0
        store = dist.TCPStore(  # type: ignore[attr-defined]
            cfg.master_addr, cfg.master_port, cfg.world_size, is_master=cfg.rank == 0, timeout=self.timeout
        )
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=cfg.rank, world_size=cfg.world_size, timeout=self.timeout)
        self.monitor = PeerMonitor(host=cfg.master_addr, port=cfg.master_port, rank=cfg.rank, world_size=cfg.world_size)

    def topology(self, rank: int, *, stages: int, data_parallel: int) -> Topology:
        return Topology(rank=rank, stages=stages, data_parallel=data_parallel)

    def share(self, compute: Callable[[], T]) -> T:
        box: list[T | None] = [compute() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        value = box[0]
        assert value is not None  # rank 0 computed it
        return value

    def open_transport(self, schedule: Schedule, topology: Topology) -> Transport:
        return DistTransport.open(
            device=self.device, schedule=schedule, replicas=topology.replicas, rank=self.rank, timeout=self.timeout
        )

    def step_end(
        self, pipeline: PipelineRank, *, start_ns: int, loss: float, local_sq_norm: torch.Tensor | None, stop: bool
    ) -> StepTotals:
        """Drain the sends, reduce the gradients, then one all-reduce of [grad norm², loss, stop]."""
        ex = pipeline.executor
        ex.waiting_on, ex.waiting_what = None, "draining sends and in the step-end all-reduce"
        ex.flush_sends()
        pipeline.sync_grads()
        stats = torch.stack(
            [
                pipeline.grad_sq_norm() if local_sq_norm is None else local_sq_norm,
                torch.tensor(loss, dtype=torch.float32, device=self.device),
                torch.tensor(float(stop), device=self.device),
            ]
        )
        work = dist.all_reduce(stats, async_op=True)
        assert work is not None
        ex.sync.wait(WorkPending(work))  # on CUDA: until the GPU completed it (the slowest rank is done)
        ex.waiting_what = None
        dp = pipeline.topo.data_parallel
        return StepTotals(float(stats[0]) / dp, float(stats[1]) / dp, bool(stats[2] > 0))

    def stage_profiles(
        self, own: Mapping[int, StageProfile], *, pipeline_ranks: Sequence[int], layers_per_stage: Sequence[int]
    ) -> dict[int, StageProfile]:
        gathered: list[Mapping[int, StageProfile] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, dict(own))
        out: dict[int, StageProfile] = {}
        for r in pipeline_ranks:  # this replica's pipeline
            entry = gathered[r]
            assert entry is not None
            out.update(entry)
        return out

    def follow(self, timeline: Timeline, pp_rank: int) -> None:
        pass

    def barrier(self) -> None:
        dist.barrier()

    def dead_peers(self) -> list[int]:
        return self.monitor.dead_peers()


class ReplayPeers:
    """Peers replaced by the modeled timeline; this rank runs its own stages' real compute alone."""

    replay = True
    collectives = False
    writes_job_state = False

    def __init__(self, device: torch.device, *, model: ModelProvider, microbatch_size: int) -> None:
        self.device, self.model, self.microbatch_size = device, model, microbatch_size
        self.transport = ReplayTransport(device=device)
        self.step_s = 0.0
        """the modeled step: when the slowest rank finishes (0 until the profile is simulated)"""

    def topology(self, rank: int, *, stages: int, data_parallel: int) -> Topology:
        return Topology(rank=rank, stages=stages, data_parallel=1)  # one replica: the replayed one

    def share(self, compute: Callable[[], T]) -> T:
        return compute()

    def open_transport(self, schedule: Schedule, topology: Topology) -> Transport:
        return self.transport

    def step_end(
        self, pipeline: PipelineRank, *, start_ns: int, loss: float, local_sq_norm: torch.Tensor | None, stop: bool
    ) -> StepTotals:
        """Wait until the slowest rank's modeled finish, as the all-reduce would."""
        self.transport.flush()
        end_ns = start_ns + int(self.step_s * 1e9)
        while (left_ns := end_ns - time.monotonic_ns()) > 0:
            time.sleep(min(1e-3, left_ns / 1e9))
        sq_norm = pipeline.grad_sq_norm() if local_sq_norm is None else local_sq_norm
        return StepTotals(float(sq_norm), loss, stop)

    def stage_profiles(
        self, own: Mapping[int, StageProfile], *, pipeline_ranks: Sequence[int], layers_per_stage: Sequence[int]
    ) -> dict[int, StageProfile]:
        parts = measure_parts(self.model, mb_size=self.microbatch_size, device=self.device)
        return modeled_stage_profiles(own, parts=parts, layers_per_stage=layers_per_stage)

    def follow(self, timeline: Timeline, pp_rank: int) -> None:
        spans = timeline.ranks[pp_rank].actions
        self.transport.release_s = {i: spans[i].start_s for i in range(len(spans))}
        self.step_s = timeline.step_s

    def barrier(self) -> None:
        pass

    def dead_peers(self) -> list[int]:
        return []


def open_peers(cfg: TrainerConfig, device: torch.device, *, model: ModelProvider, microbatch_size: int) -> Peers:
    """Replay when ``cfg.replay_stage`` is set (``--replay-stage``), else join the job's process group."""
    if cfg.replay_stage is not None:
        return ReplayPeers(device, model=model, microbatch_size=microbatch_size)
    return DistPeers(cfg, device)
