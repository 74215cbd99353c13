"""One rank of the gradient-equivalence test: for each configuration, one training step; gradients and loss to disk.

Run as ``python _grad_worker.py CONFIGS_JSON OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.
A configuration with ``"transport": "one-group"`` runs on :func:`one_group_transport` instead of ours; if it fails,
the error goes to disk in place of the gradients.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipefill.schedules.generators import build_schedule
from pipefill.schedules.model import Schedule
from pipefill.schedules.validate import p2p_streams

sys.path.insert(0, str(Path(__file__).parent))
from _grad_common import batch, provider

from pipefill_trainer.comm import DistTransport, Transport
from pipefill_trainer.partition import analytic_costs, partition_layers
from pipefill_trainer.pipeline import PipelineRank, Topology


def one_group_transport(*, schedule: Schedule, pp_rank: int, pipeline_ranks: Sequence[int], group: Any) -> Transport:
    """The design before issue #5 under NCCL's matching rule: every stream between two ranks on one process group
    (spanning the world, so group ranks are global ranks), one constant tag — a pair's messages match in posting
    order whatever stream they belong to."""
    links = {}
    for st in p2p_streams(schedule):
        if pp_rank in (st.src_rank, st.dst_rank):
            other = st.dst_rank if pp_rank == st.src_rank else st.src_rank
            links[(st.src_stage, st.dst_stage)] = (group, pipeline_ranks[other])
    return DistTransport(device=torch.device("cpu"), links=links)


def train(pr: PipelineRank, c: dict[str, Any], tokens: Any, targets: Any) -> list[float]:
    """``c["train"]`` AdamW steps on the same batch after the gradient step; the losses (the last stage's)."""
    opt = torch.optim.AdamW(pr.parameters(), lr=1e-2)
    losses = []
    for _ in range(c["train"]):
        opt.step()
        pr.zero_grad()
        losses.append(
            pr.executor.run_step(tokens if pr.has_first_stage() else None, targets if pr.has_last_stage() else None)
        )
        pr.executor.flush_sends()
        pr.sync_grads()
    return losses


def main() -> None:
    configs, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    one_group = dist.new_group(list(range(world)), timeout=timedelta(seconds=5))
    for c in configs:
        model = provider(c)
        schedule = build_schedule(
            c["schedule"], ranks=c["stages"], microbatches=c["m"], virtual_stages=c.get("v"), csv_text=c.get("csv")
        )
        ranges = partition_layers(model.layers, schedule.num_stages, costs=analytic_costs(model))
        topo = Topology(rank=rank, stages=c["stages"], data_parallel=c.get("dp", 1))
        transport: Transport
        if c.get("transport") == "one-group":
            transport = one_group_transport(
                schedule=schedule, pp_rank=topo.pp_rank, pipeline_ranks=topo.pipeline_ranks, group=one_group
            )
        else:
            transport = DistTransport.open(
                device=torch.device("cpu"), schedule=schedule, replicas=topo.replicas, rank=rank, timeout=timeout
            )
        pr = PipelineRank(
            provider=model,
            schedule=schedule,
            topo=topo,
            layer_ranges=ranges,
            mb_size=c["mb"],
            device=torch.device("cpu"),
            transport=transport,
        )
        tokens, targets = batch(c, dp_rank=topo.dp_rank)
        path = out / f"{c['id']}-rank{rank}.pt"
        try:
            loss = pr.executor.run_step(
                tokens if pr.has_first_stage() else None, targets if pr.has_last_stage() else None
            )
            pr.executor.flush_sends()
        except RuntimeError as exc:  # only expected of the one-group transport
            torch.save({"error": str(exc)}, path)
            dist.barrier()
            continue
        pr.sync_grads()
        grads = {name: p.grad.clone() for name, p in pr.named_parameters().items() if p.grad is not None}
        missing = [name for name, p in pr.named_parameters().items() if p.grad is None]
        losses = train(pr, c, tokens, targets) if c.get("train") else []
        torch.save(
            {"loss": loss, "grads": grads, "missing": missing, "last": pr.has_last_stage(), "losses": losses}, path
        )
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
