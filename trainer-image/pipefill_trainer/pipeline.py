"""One rank's share of the pipeline: its stages, the executor, and the gradient reductions around a step.

Global rank layout: ``rank = dp_rank · stages + pp_rank`` — each data-parallel replica is a contiguous block of ranks
running the whole pipeline; the ranks holding the same pipeline position form a data-parallel group whose gradients
are averaged. A parameter several stages hold (the model provider's :class:`~pipefill_trainer.provider.TiedParameter`:
tied input and output embeddings) has one copy per holding stage; their gradients are summed between the holding ranks
(or the copies are one tensor when one rank holds them all, as the first and last stage in ZB-V).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from pipefill.schedules.model import Schedule
from pipefill_trainer.comm import Transport
from pipefill_trainer.executor import PipelineExecutor
from pipefill_trainer.model import make_deferrable, undeferred
from pipefill_trainer.provider import ModelProvider, TiedParameter

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

    ``timeout``: of the data-parallel and tied-parameter groups' operations (torch's default of 30 min otherwise).
    ``dtype``: of the stages' weights (None: the provider's default); ``autocast_dtype``: of their compute.
    """

    def __init__(
        self,
        *,
        provider: ModelProvider,
        schedule: Schedule,
        topo: Topology,
        layer_ranges: Sequence[range],
        mb_size: int,
        device: torch.device,
        transport: Transport,
        dtype: torch.dtype | None = None,
        autocast_dtype: torch.dtype | None = None,
        distributed: bool = True,
        timeout: timedelta | None = None,
    ) -> None:
        if schedule.num_stages != len(layer_ranges):
            raise ValueError(f"{len(layer_ranges)} layer ranges for {schedule.num_stages} stages")
        self.provider, self.schedule, self.topo, self.device = provider, schedule, topo, device
        self.distributed = distributed
        n = schedule.num_stages
        self.stage_ids = schedule.stages_of(topo.pp_rank)
        self.stages: dict[int, nn.Module] = {
            s: provider.build_stage(stage_idx=s, num_stages=n, layers=layer_ranges[s], device=device, dtype=dtype)
            for s in self.stage_ids
        }
        for module in self.stages.values():  # any provider's nn.Linear layers get the zero-bubble split
            make_deferrable(module)
        self.tied = provider.tied_parameters(n)
        for tie in self.tied:
            held = [s for s in tie.names if s in self.stages]
            for s in held[1:]:  # this rank holds several copies: make them one tensor
                _set_parameter(self.stages[s], tie.names[s], self.stages[held[0]].get_parameter(tie.names[held[0]]))
        self.executor = PipelineExecutor(
            schedule=schedule,
            pp_rank=topo.pp_rank,
            stages=self.stages,
            pipeline_ranks=topo.pipeline_ranks,
            transport=transport,
            provider=provider,
            mb_size=mb_size,
            device=device,
            autocast_dtype=autocast_dtype,
        )
        self._dp_group = None
        self._tied_groups: list[tuple[TiedParameter, dist.ProcessGroup]] = []
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
        for tie in self.tied:
            holders = sorted({self.schedule.placement[s] for s in tie.names})
            if len(holders) < 2:
                continue  # one rank holds every copy: one tensor
            for dp in range(topo.data_parallel):
                group = dist.new_group([dp * topo.stages + pp for pp in holders], timeout=timeout)
                if dp == topo.dp_rank and topo.pp_rank in holders:
                    self._tied_groups.append((tie, group))

    def undeferred(self) -> list[str]:
        """What ``W`` cannot take: this rank's modules whose weight gradients ``I`` computes (zero-bubble schedules)."""
        return [f"stage {s}: {what}" for s in self.stage_ids for what in undeferred(self.stages[s])]

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
        """Whether :meth:`sync_grads` talks to other ranks (data parallel, or a tied parameter split over ranks)."""
        return self._dp_group is not None or bool(self._tied_groups)

    def sync_grads(self) -> None:
        """Average gradients over the data-parallel group, then sum each tied parameter's copies."""
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
        for tie, group in self._tied_groups:
            param = self._tied_copy(tie)
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, group=group)

    def _tied_copy(self, tie: TiedParameter) -> nn.Parameter:
        """This rank's copy of ``tie`` (the one tensor, if it holds several)."""
        s = next(s for s in tie.names if s in self.stages)
        return self.stages[s].get_parameter(tie.names[s])

    def grad_sq_norm(self) -> torch.Tensor:
        """Sum of squared gradients of the parameters this rank owns (a tied copy is owned by its first stage)."""
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        skip = {id(self._tied_copy(tie)) for tie, _ in self._tied_groups if tie.owner not in self.stages}
        for p in self.parameters():
            if p.grad is not None and id(p) not in skip:
                total += p.grad.float().pow(2).sum()
        return total

    def has_first_stage(self) -> bool:
        return 0 in self.stages

    def has_last_stage(self) -> bool:
        return self.schedule.num_stages - 1 in self.stages


def _set_parameter(module: nn.Module, name: str, param: nn.Parameter) -> None:
    """Make ``module``'s parameter ``name`` (dotted) be ``param``."""
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner), leaf, param)
