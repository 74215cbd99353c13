"""One rank's share of the pipeline: its stages, the executor, and the gradient reductions around a step.

Global rank layout: ``rank = dp_rank · stages + pp_rank`` — each data-parallel replica is a contiguous block of ranks
running the whole pipeline; the ranks holding the same pipeline position form a data-parallel group whose gradients
are averaged. With tied embeddings the first and last stage each hold a copy of the embedding; their gradients are
summed between the two ranks (or the copies are one tensor when one rank holds both, as in ZB-V).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pipefill.schedules.model import Schedule
from pipefill_trainer.comm import Transport
from pipefill_trainer.executor import PipelineExecutor
from pipefill_trainer.model import GPTConfig, StageModule, build_stage

__all__ = ["PipelineRank", "Topology"]


@dataclass(frozen=True)
class Topology:
    """Where this process sits: ``stages`` pipeline ranks (``pp``) × ``data_parallel`` replicas."""

    rank: int
    stages: int
    data_parallel: int = 1

    @property
    def world_size(self) -> int:
        return self.stages * self.data_parallel

    @property
    def pp_rank(self) -> int:
        return self.rank % self.stages

    @property
    def dp_rank(self) -> int:
        return self.rank // self.stages

    @property
    def pipeline_ranks(self) -> list[int]:
        """Global ranks of this replica's pipeline, by pipeline rank."""
        return [self.dp_rank * self.stages + i for i in range(self.stages)]

    @property
    def replicas(self) -> list[list[int]]:
        """Global ranks of every replica's pipeline: ``replicas[dp_rank][pp_rank]``."""
        return [[d * self.stages + i for i in range(self.stages)] for d in range(self.data_parallel)]

    def dp_group_ranks(self, pp_rank: int) -> list[int]:
        return [d * self.stages + pp_rank for d in range(self.data_parallel)]


class PipelineRank:
    """Builds this rank's stages (and only those) and runs steps; reductions need ``dist`` unless ``distributed=False``.

    ``timeout``: of the data-parallel and tied-embedding groups' operations (torch's default of 30 min otherwise).
    """

    def __init__(
        self,
        *,
        cfg: GPTConfig,
        schedule: Schedule,
        topo: Topology,
        layer_ranges: Sequence[range],
        mb_size: int,
        device: torch.device,
        transport: Transport,
        autocast_dtype: torch.dtype | None = None,
        distributed: bool = True,
        timeout: timedelta | None = None,
    ) -> None:
        if schedule.num_stages != len(layer_ranges):
            raise ValueError(f"{len(layer_ranges)} layer ranges for {schedule.num_stages} stages")
        self.cfg, self.schedule, self.topo, self.device = cfg, schedule, topo, device
        self.distributed = distributed
        n = schedule.num_stages
        self.stage_ids = schedule.stages_of(topo.pp_rank)
        self.stages: dict[int, StageModule] = {
            s: build_stage(cfg, stage_idx=s, num_stages=n, layers=layer_ranges[s], device=device)
            for s in self.stage_ids
        }
        self.first_rank, self.last_rank = schedule.placement[0], schedule.placement[n - 1]
        if cfg.tied_embeddings and 0 in self.stages and n - 1 in self.stages and n > 1:
            self.stages[n - 1].wte = self.stages[0].wte  # one rank holds both ends: one tensor
        self.executor = PipelineExecutor(
            schedule=schedule,
            pp_rank=topo.pp_rank,
            stages=self.stages,
            pipeline_ranks=topo.pipeline_ranks,
            transport=transport,
            mb_shape=(mb_size, cfg.seq_len),
            hidden=cfg.hidden,
            device=device,
            autocast_dtype=autocast_dtype,
        )
        self._dp_group = self._tied_group = None
        if distributed:
            self._make_groups(timeout)

    def _make_groups(self, timeout: timedelta | None) -> None:
        # every rank creates every group, in the same order (new_group is collective)
        topo = self.topo
        if topo.data_parallel > 1:
            for pp in range(topo.stages):
                group = dist.new_group(topo.dp_group_ranks(pp), timeout=timeout)
                if pp == topo.pp_rank:
                    self._dp_group = group
        if self.cfg.tied_embeddings and self.first_rank != self.last_rank:
            for dp in range(topo.data_parallel):
                ranks = [dp * topo.stages + self.first_rank, dp * topo.stages + self.last_rank]
                group = dist.new_group(ranks, timeout=timeout)
                if dp == topo.dp_rank and topo.pp_rank in (self.first_rank, self.last_rank):
                    self._tied_group = group

    def parameters(self) -> list[torch.nn.Parameter]:
        """This rank's parameters, each once."""
        seen: dict[int, torch.nn.Parameter] = {}
        for s in self.stage_ids:
            for p in self.stages[s].parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        out: dict[str, torch.nn.Parameter] = {}
        for s in self.stage_ids:
            for name, p in self.stages[s].named_parameters():
                out.setdefault(name, p)
        return out

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def has_grad_collectives(self) -> bool:
        """Whether :meth:`sync_grads` talks to other ranks (data parallel, or a tied embedding split over stages)."""
        return self._dp_group is not None or self._tied_group is not None

    def sync_grads(self) -> None:
        """Average gradients over the data-parallel group, then sum the tied embedding's two copies."""
        params = [p for p in self.parameters() if p.grad is not None]
        if self._dp_group is not None and params:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=self._dp_group)
            flat /= self.topo.data_parallel
            offset = 0
            for p in params:
                numel = p.numel()
                p.grad.copy_(flat[offset : offset + numel].view_as(p))
                offset += numel
        if self._tied_group is not None:
            wte = self.stages[self.stage_ids[0] if 0 in self.stages else self.schedule.num_stages - 1].wte.weight
            if wte.grad is None:
                wte.grad = torch.zeros_like(wte)
            dist.all_reduce(wte.grad, group=self._tied_group)

    def grad_sq_norm(self) -> torch.Tensor:
        """Sum of squared gradients of the parameters this rank owns (the last stage's tied copy is not owned)."""
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        skip: set[int] = set()
        if self._tied_group is not None and 0 not in self.stages:
            skip.add(id(self.stages[self.schedule.num_stages - 1].wte.weight))
        for p in self.parameters():
            if p.grad is not None and id(p) not in skip:
                total += p.grad.float().pow(2).sum()
        return total

    def has_first_stage(self) -> bool:
        return 0 in self.stages

    def has_last_stage(self) -> bool:
        return self.schedule.num_stages - 1 in self.stages
