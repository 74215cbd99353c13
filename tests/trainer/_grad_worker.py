"""One rank of the gradient-equivalence test: for each configuration, one training step; gradients and loss to disk.

Run as ``python _grad_worker.py CONFIGS_JSON OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pipefill.schedules.generators import build_schedule

sys.path.insert(0, str(Path(__file__).parent))
from _grad_common import batch, model_config
from pipefill_trainer.comm import DistTransport
from pipefill_trainer.partition import analytic_costs, partition_layers
from pipefill_trainer.pipeline import PipelineRank, Topology


def main() -> None:
    configs, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    for c in configs:
        cfg = model_config(c)
        schedule = build_schedule(
            c["schedule"], ranks=c["stages"], microbatches=c["m"], virtual_stages=c.get("v"), csv_text=c.get("csv")
        )
        ranges = partition_layers(cfg.layers, schedule.num_stages, costs=analytic_costs(cfg))
        topo = Topology(rank=rank, stages=c["stages"], data_parallel=c.get("dp", 1))
        pr = PipelineRank(
            cfg=cfg,
            schedule=schedule,
            topo=topo,
            layer_ranges=ranges,
            mb_size=c["mb"],
            device=torch.device("cpu"),
            transport=DistTransport(device=torch.device("cpu")),
        )
        tokens, targets = batch(c, dp_rank=topo.dp_rank)
        loss = pr.executor.run_step(tokens if pr.has_first_stage() else None, targets if pr.has_last_stage() else None)
        pr.executor.flush_sends()
        pr.sync_grads()
        grads = {name: p.grad.clone() for name, p in pr.named_parameters().items() if p.grad is not None}
        missing = [name for name, p in pr.named_parameters().items() if p.grad is None]
        torch.save(
            {"loss": loss, "grads": grads, "missing": missing, "last": pr.has_last_stage()},
            out / f"{c['id']}-rank{rank}.pt",
        )
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
