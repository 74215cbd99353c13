"""A plain torch.distributed.pipelining training script: the smallest user of the bubble hook.

Nothing in it knows PipeFill. It reads the rank environment torchrun (or the operator's pod) gives — RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT — builds its stages of a small MLP, runs one of torch's schedules (or a CSV
schedule) for a few steps with SGD, and prints the loss of every step from rank 0 after a blocking all-reduce (the
collective most training loops make after ``step``). With ``PIPEFILL_HOOK=1`` and the hook on ``PYTHONPATH``
(docs/trainer.md, "Your own training command"), its bubbles are announced to the fill; the losses stay the same.

    torchrun --nproc-per-node 2 examples/pipelining/train.py --schedule 1F1B --steps 20
    torchrun --nproc-per-node 2 examples/pipelining/train.py --schedule ZBVZeroBubble --microbatches 8
    torchrun --nproc-per-node 2 examples/pipelining/train.py --csv my-schedule.csv --microbatches 4

Every parameter is seeded by its place in the whole model and every batch by its step, so any schedule and any
run computes the same model (up to floating-point summation order).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as sch

V_SCHEDULES = {"ZBVZeroBubble", "DualPipeV"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedule", default="1F1B", help="a name torch's get_schedule_class knows (default 1F1B)")
    p.add_argument("--csv", default="", help="a compute-only CSV schedule (torch's _load_csv); overrides --schedule")
    p.add_argument("--stages-per-rank", type=int, default=0, help="default: 1, or 2 for a multi-stage schedule")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    # 1024 wide, 4 microbatches of 64 rows: a stage's forward of a microbatch takes ~3 ms on an idle CPU core and
    # its backward ~6 ms, so 1F1B's bubbles on 2 ranks are 3–6 ms, long enough for a fill to use (256 wide and 8
    # rows gave bubbles of ~0.1–0.4 ms, shorter than the fill's 1 ms floor)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers-per-stage", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="rows per step (split into the microbatches)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--losses", default="", help="rank 0 writes the per-step losses here as JSON")
    return p.parse_args()


def my_stages(args: argparse.Namespace, rank: int, world: int) -> tuple[list[int], int]:
    """The stage indices this rank holds, and the stage count."""
    if args.csv:
        with open(args.csv, newline="") as f:
            rows = [[c for c in row if c.strip()] for row in csv.reader(f)]
        stages = {int(m.group(1)) for m in (re.match(r"(\d+)", c) for c in rows[rank]) if m}
        total = 1 + max(int(re.match(r"(\d+)", c).group(1)) for row in rows for c in row)  # type: ignore[union-attr]
        return sorted(stages), total
    cls = sch.get_schedule_class(args.schedule)
    per_rank = args.stages_per_rank or (1 if issubclass(cls, sch.PipelineScheduleSingle) else 2)
    total = world * per_rank
    if args.schedule in V_SCHEDULES:
        return sorted({rank, 2 * world - 1 - rank}), total
    return [rank + k * world for k in range(per_rank)], total


def stage_module(stage_idx: int, args: argparse.Namespace) -> nn.Module:
    layers: list[nn.Module] = []
    for k in range(args.layers_per_stage):
        torch.manual_seed(1000 * stage_idx + k)
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    return nn.Sequential(*layers)


def main() -> None:
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    stage_ids, num_stages = my_stages(args, rank, world)
    modules = {s: stage_module(s, args) for s in stage_ids}
    stages = [PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in stage_ids]

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)

    if args.csv:
        schedule: sch._PipelineSchedule = sch._PipelineScheduleRuntime(stages, args.microbatches, loss_fn=loss_fn)
        schedule._load_csv(args.csv)
    else:
        cls = sch.get_schedule_class(args.schedule)
        if issubclass(cls, sch.PipelineScheduleSingle):
            schedule = cls(stages[0], args.microbatches, loss_fn=loss_fn)
        else:
            schedule = cls(stages, args.microbatches, loss_fn=loss_fn)
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr)
    has_first, has_last = 0 in stage_ids, num_stages - 1 in stage_ids
    history = []
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(args.batch, args.width, generator=gen)
        y = torch.sin(x)
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        inputs = (x,) if has_first else ()
        schedule.step(*inputs, target=y if has_last else None, losses=losses)
        optimizer.step()
        total = torch.stack(losses).mean().detach() if has_last else torch.zeros(())
        dist.all_reduce(total)  # every rank learns the loss: the step's end
        history.append(float(total))
        if rank == 0:
            print(f"step {step} loss {float(total):.6f}", flush=True)
    if rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            json.dump(history, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
