"""A seeded, realistic cluster snapshot for the scheduler benchmark: many training jobs of a few shapes, a mixed
queue of FillJobs, a third of them running already.

Training jobs come in six shapes (model, schedule, microbatches, fill memory), so their ranks' predicted bubbles
differ by stage and shape; every other job's ranks report classes (the prediction with ±10 % jitter, so no two are
equal), the others have none and are predicted. One in five admits only ``tier=batch`` FillJobs, one in twenty is
not Running, one in twenty has fill disabled. FillJobs run one of 20 workloads (profiles of 7 batch sizes): 80 %
with a measured profile, 12 % with a spec estimate, 8 % with neither; sizes spread over three orders of magnitude;
a mix of priorities, deadlines, hostSelectors and maxParallelRanks. The running third was placed by a ``fifo`` pass
over it and has made progress; of the others about one in ten has finished and one in ten carries an unfit report.
"""

from __future__ import annotations

import functools
import random
from dataclasses import replace

from pipefill.plan import ProfilePoint
from pipefill.queue.predict import predict_ranks
from pipefill.queue.scheduler import schedule_pass
from pipefill.queue.snapshot import FillJobView, RankView, SliceStatus, Snapshot, TrainingJobView, Unfit
from pipefill.spec import PipelineTrainingJob, parse
from pipefill.spec.common import LabelSelector, LabelSelectorRequirement, SelectorOperator

__all__ = ["synthetic_snapshot"]

_GIB = 1 << 30
_SHAPES = (  # preset, schedule, microbatches, virtual stages, fill memory
    ("gpt-1.3b", "1f1b", 16, 1, "8Gi"),
    ("gpt-1.3b", "gpipe", 8, 1, "4Gi"),
    ("gpt-7b", "1f1b", 32, 1, "6Gi"),
    ("gpt-7b", "interleaved-1f1b", 16, 2, "10Gi"),
    ("gpt2-medium", "1f1b", 8, 1, "16Gi"),
    ("gpt-7b", "zero-bubble-h1", 16, 1, "6Gi"),
)
_TEAMS = ("vision", "language", "speech", "research")


def synthetic_snapshot(
    *, training_jobs: int = 100, ranks_per_job: int = 8, fill_jobs: int = 1000, seed: int = 0
) -> Snapshot:
    rng = random.Random(seed)
    tjs = tuple(_training_job(rng, i, ranks_per_job) for i in range(training_jobs))
    profiles = [_profile(rng) for _ in range(20)]
    views = [_fill_job(rng, j, profiles) for j in range(fill_jobs)]
    running = {v.key for v in views if rng.random() < 0.3}
    first = schedule_pass(Snapshot(tuple(v for v in views if v.key in running), tjs), policy="fifo")
    out = []
    for v in views:
        o = first.jobs.get(v.key)
        if o is not None and o.assignments:
            slices = tuple(SliceStatus(s.start, s.end, s.start + (s.end - s.start) // 3) for s in o.slices)
            v = replace(v, phase="Running", slices=slices, assignments=o.assignments, epoch=o.epoch)
        elif rng.random() < 0.1:
            v = replace(v, phase="Succeeded")
        elif rng.random() < 0.1:
            t = tjs[rng.randrange(len(tjs))]
            v = replace(v, unfit=(Unfit(t.name, rng.randrange(ranks_per_job), "no bubble long enough"),))
        out.append(v)
    return Snapshot(tuple(out), tjs)


@functools.lru_cache(maxsize=len(_SHAPES))
def _spec(shape_idx: int, stages: int) -> PipelineTrainingJob:
    preset, schedule, microbatches, virtual, memory = _SHAPES[shape_idx]
    obj = {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "PipelineTrainingJob",
        "metadata": {"name": f"shape-{shape_idx}"},
        "spec": {
            "model": {"preset": preset, "seqLen": 2048},
            "pipeline": {
                "stages": stages,
                "microbatches": microbatches,
                "globalBatch": microbatches * 4,
                "schedule": schedule,
                "virtualStages": virtual,
            },
            "fill": {"reservedMemory": memory},
        },
    }
    job = parse(obj)
    if not isinstance(job, PipelineTrainingJob):
        raise TypeError(f"shape {shape_idx} parsed as {type(job).__name__}")
    return job


def _training_job(rng: random.Random, i: int, stages: int) -> TrainingJobView:
    shape = i % len(_SHAPES)
    job = _spec(shape, stages)
    name = f"train-{i:03d}"
    predicted = predict_ranks(job.spec)
    ranks = []
    for r in range(stages):
        pod = f"{name}-0-{r}"
        if i % 2 == 0:
            guess = predicted[r]
            classes = tuple(replace(c, duration_s=c.duration_s * rng.uniform(0.9, 1.1)) for c in guess.classes)
            ranks.append(RankView(r, pod, f"uid-{pod}", classes, guess.step_s * rng.uniform(0.95, 1.05)))
        else:
            ranks.append(RankView(r, pod, f"uid-{pod}"))
    only_batch = LabelSelector(match_expressions=[LabelSelectorRequirement("tier", SelectorOperator.IN, ["batch"])])
    view = TrainingJobView.from_spec(
        job,
        ranks=tuple(ranks),
        running=i % 20 != 7,
        fill_job_selector=only_batch if i % 5 == 0 else None,
    )
    return replace(view, name=name, labels={"team": _TEAMS[i % len(_TEAMS)]}, fill_enabled=i % 20 != 11)


def _profile(rng: random.Random) -> tuple[ProfilePoint, ...]:
    base_s = rng.uniform(0.5e-3, 20e-3)
    base_bytes = int(rng.uniform(0.3, 6.0) * _GIB)
    per_item = int(rng.uniform(2, 64) * (1 << 20))
    return tuple(
        ProfilePoint(b, base_s * (0.4 + 0.6 * b**0.85), base_bytes + b * per_item) for b in (1, 2, 4, 8, 16, 32, 64)
    )


def _fill_job(rng: random.Random, j: int, profiles: list[tuple[ProfilePoint, ...]]) -> FillJobView:
    training = rng.random() < 0.15
    profile = profiles[rng.randrange(len(profiles))]
    known = rng.random()
    selector = LabelSelector(match_labels={"team": rng.choice(_TEAMS)}) if rng.random() < 0.25 else LabelSelector()
    return FillJobView(
        name=f"fill-{j:04d}",
        total=int(10 ** rng.uniform(3, 6)),
        created_unix_s=1.7e9 + j,
        kind="training" if training else "inference",
        priority=rng.choice((-1, 0, 0, 0, 1, 5)),
        deadline_unix_s=1.7e9 + rng.uniform(1e3, 1e5) if rng.random() < 0.3 else None,
        labels={"tier": "batch" if rng.random() < 0.7 else "interactive"},
        host_selector=selector,
        max_parallel_ranks=1 if training else rng.choice((1, 1, 2, 4, 8)),
        estimate_step_s=profile[0].step_s if 0.8 <= known < 0.92 else None,
        estimate_peak_bytes=profile[0].peak_bytes if 0.8 <= known < 0.92 else None,
        profile=profile if known < 0.8 else (),
    )
