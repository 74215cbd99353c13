"""``python -m pipefill_trainer.bench_worker``: one rank of ``pipefill bench trainer`` (:mod:`pipefill.bench.trainer`).

The benchmark's orchestration lives in the core and starts two of these, one per rank, with the trainer's environment
contract. Each trains alternating blocks of steps with our trainer and with ``torch.distributed.pipelining`` over the
same stage modules, and writes its step times and bubble prediction errors to ``--result`` as JSON. Only the
benchmark imports this module; the trainer's runtime never does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from pipefill_trainer.config import TrainerConfig
from pipefill_trainer.runtime import build_rank
from pipefill_trainer.train import Trainer

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipefill_trainer.bench_worker", description=__doc__.splitlines()[0])
    p.add_argument("--result", required=True, type=Path, help="where to write this rank's result (JSON)")
    p.add_argument("--blocks", type=int, default=6, help="alternating blocks per engine")
    p.add_argument("--steps-per-block", type=int, default=8)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return _run(_args(argv))


def _run(args: argparse.Namespace) -> int:
    parts = build_rank(TrainerConfig.from_env(profile_steps=3))
    trainer, pipeline, schedule_ours = Trainer(parts), parts.pipeline, parts.shape.schedule
    stage_idx = pipeline.stage_ids[0]
    stage = PipelineStage(pipeline.stages[stage_idx], stage_idx, schedule_ours.num_stages, parts.device)
    cls = ScheduleGPipe if schedule_ours.name == "gpipe" else Schedule1F1B  # the job's schedule, in torch

    schedule = cls(stage, n_microbatches=parts.shape.microbatches, loss_fn=parts.model.loss)
    step = 0
    for _ in range(parts.cfg.profile_steps + 2):  # profile, then settle the predictions
        trainer.step(step)
        step += 1

    def torch_step(k: int) -> float:
        tokens, targets = parts.data.batch(k, dp_rank=0)
        pipeline.zero_grad()
        t0 = time.perf_counter()
        if pipeline.has_first_stage():
            schedule.step(tokens)
        else:
            schedule.step(target=targets, losses=[])
        # the same step end as ours: grad-norm all-reduce, clipping, AdamW
        stats = torch.stack([pipeline.grad_sq_norm(), torch.zeros(()), torch.zeros(())])
        dist.all_reduce(stats)
        trainer.clip_and_step(k, float(stats[0]))
        return time.perf_counter() - t0

    torch_step(0)  # torch's first step infers shapes
    ours: list[float] = []
    theirs: list[float] = []
    errors: list[float] = []
    for _ in range(args.blocks):
        dist.barrier()
        for _ in range(args.steps_per_block):
            ours.append(trainer.step(step).step_s)
            assert trainer.announcer is not None
            for rec in trainer.announcer.records:  # the bubbles big enough to announce
                measured = (rec.end_ns - rec.start_ns) / 1e9
                if rec.predicted_s >= trainer.announcer.floor_s() and measured > 0:
                    errors.append(abs(rec.predicted_s - measured) / measured)
            step += 1
        dist.barrier()
        for _ in range(args.steps_per_block):
            theirs.append(torch_step(step))
            step += 1
    ours_s, torch_s = statistics.median(ours), statistics.median(theirs)
    result: dict[str, Any] = {
        "ours_step_s": ours_s,
        "torch_step_s": torch_s,
        "ratio": ours_s / torch_s,
        "steps_per_engine": len(ours),
        "errors": errors,
    }
    Path(args.result).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
