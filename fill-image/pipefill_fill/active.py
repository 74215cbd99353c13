"""A job an executor works on (:class:`ActiveJob`): the task of the slice it holds, and what carries over from slice
to slice; and which batch sizes its steps will run (:func:`tail_sizes`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipefill.plan import ObservedBubble
from pipefill.queue.status import Identity
from pipefill.spec.fillstatus import ProfileEntry, UnfitReport
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.inpieces import PieceCosts
from pipefill_fill.offload import Offloader
from pipefill_fill.overruns import Margin
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.profiler import BubbleProfiler, Profile
from pipefill_fill.settings import Settings
from pipefill_fill.slices import JobDir
from pipefill_fill.sources.base import now_rfc3339
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.unfit import STARVED_BUBBLES, STARVED_SHARE, starved_report, unit_s
from pipefill_fill.work import Slice

__all__ = ["COMMIT_DEFAULT_S", "ActiveJob", "tail_sizes"]

COMMIT_DEFAULT_S = 0.010
"""What a commit's device part is assumed to cost before one was measured (a slice's start-up measures one)."""


@dataclass
class ActiveJob:
    """A job this executor works on: the task of the slice it holds, and what carries over from slice to slice
    (the profile, step and commit time estimates, the reporting state)."""

    spec: TaskSpec
    job: JobDir
    task: FillTask
    profiler: BubbleProfiler
    offloader: Offloader | None
    model: StepModel | None = None
    # shared by the jobs of its workload on the executor (Jobs.commit_estimates): a job commits a few times only, and
    # the high quantile of so few was its slowest (15.7 ms once, 0.4 ms typical: a job's last commit fitted no 10 ms
    # bubble for a second in bench fill-queue's 100 jobs)
    commit_estimate: Estimator = field(default_factory=lambda: Estimator(default_s=COMMIT_DEFAULT_S))
    transfer_estimate: Estimator = field(default_factory=lambda: Estimator(default_s=0.0))
    margin: Margin = field(default_factory=Margin)
    profile_taken: bool = False  # the complete profile was taken in (:meth:`Jobs.profiled`)
    early: StepModel | None = None  # the step model of the sizes measured while the profile goes on
    seed: StepModel | None = None  # the step model of the last job of its workload here: its first steps' margins
    _costs: tuple[object, PieceCosts | None] | None = None  # (the profile, its piece costs)
    started: str = field(default_factory=now_rfc3339)
    reported_at: float = 0.0
    rate_units: int = 0
    rate_since: float = field(default_factory=time.monotonic)
    # of its bubbles lately: those with steps, those nothing fitted, those a batch completed in (STARVED_BUBBLES)
    offered: tuple[int, int, int] = (0, 0, 0)

    def starving(
        self, out: BubbleOutcome, bubbles: Callable[[], list[ObservedBubble]], identity: Identity, settings: Settings
    ) -> UnfitReport | None:
        """Count a bubble of this profiled job; once :data:`~pipefill_fill.unfit.STARVED_BUBBLES` were counted, why it
        fits none of them when fewer than :data:`~pipefill_fill.unfit.STARVED_SHARE` had steps, or when no batch was
        completed in any (its pieces ran, and its batch in flight was dropped where a later piece fitted no bubble);
        else the count starts over. Counted: bubbles it ran steps in, and bubbles it ran nothing in because nothing
        fitted the time left."""
        if self.profile is None or not self.profile_taken or not (out.steps or out.stop == "time"):
            return None
        worked, starved, completed = self.offered
        worked, starved, completed = worked + (out.steps > 0), starved + (out.steps == 0), completed + (out.items > 0)
        counted = worked + starved
        self.offered = (worked, starved, completed) if counted < STARVED_BUBBLES else (0, 0, 0)
        if counted < STARVED_BUBBLES or (worked >= STARVED_SHARE * counted and completed):
            return None
        unit = min((unit_s(p) for p in self.profile.points), default=0.0)
        free, guard = settings.reserved_bytes, settings.guard_s
        return starved_report(
            starved, worked, unit, bubbles(), identity=identity, free_bytes=free, guard_s=guard, completed=completed
        )

    @property
    def measured(self) -> tuple[ProfileEntry, ...]:
        """Its profile as a status report gives it (ms)."""
        points = self.profile.points if self.profile is not None else ()
        return tuple(ProfileEntry(p.batch_size, p.step_s * 1e3, p.peak_bytes) for p in points if p.step_s > 0)

    def commit_rest(self) -> None:
        """Commit what was stepped and not committed yet (at shutdown: a restart continues from there)."""
        if self.task.progress > self.task.committed and self.profile is not None:
            if self.offloader is not None:
                self.offloader.to_device()
            self.task.commit()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def slice(self) -> Slice:
        return self.task.slice

    @property
    def profile(self) -> Profile | None:
        return self.profiler.result

    def early_model(self) -> StepModel | None:
        """While the profile is being measured: a step model of the batch sizes measured so far (None: none yet), so
        the job works in the time its next measurement does not fit (issue #25: a job starts with its first measured
        points, the smallest batch first)."""
        points = self.profiler.points
        if not points:
            return None
        if self.early is None or len(self.early.sizes) != len(points):
            self.early = self.step_model({p.batch_size: p.step_s for p in points})
        return self.early

    def step_model(self, profiled_s: dict[int, float]) -> StepModel:
        """A step model of ``profiled_s`` that starts from the steps measured already (by the early model, else by the
        last job of the workload), not cold (:data:`pipefill_fill.predict.COLD_RATIO`)."""
        model = StepModel(profiled_s)
        if (known := self.early or self.seed) is not None:
            model.adopt_ratios(known)
        return model

    def piece_costs(self) -> PieceCosts | None:
        """The pieces of the job's steps, from its complete profile: None when its workload runs whole steps only (or
        the profile has no piece times, e.g. cached before partial steps)."""
        profile = self.profile
        if profile is None or self.task.pieces is None:
            return None
        if self._costs is None or self._costs[0] is not profile:
            costs = PieceCosts(profile.points)
            self._costs = (profile, costs if costs else None)
        return self._costs[1]

    @property
    def any_batch_size(self) -> bool:
        """Whether steps may run any batch size up to the profiled ones (tails sized to the time left): inference
        workloads unless they set ``any_batch_size = False``; training runs its profiled sizes only."""
        return bool(getattr(self.task.workload, "any_batch_size", self.spec.kind == "inference"))


_WARM_TAILS_S = 1.0
"""At most this much (predicted) goes to the first calls of every batch size below the largest profiled one."""


def tail_sizes(a: ActiveJob) -> list[int]:
    """The batch sizes a profiled job's steps will run: its profiled ones, and — for a job whose steps may run any
    size (the tails of bubbles) — every size up to the largest when their first calls are predicted to take at most
    :data:`_WARM_TAILS_S` (a call each: the profile predicts them, no second call is timed)."""
    points = a.profile.points if a.profile is not None else ()
    profiled = [p.batch_size for p in points]
    if not profiled or not a.any_batch_size:
        return profiled
    model = StepModel({p.batch_size: p.step_s for p in points})
    every = list(range(1, max(profiled) + 1))
    return every if sum(model.base_s(b) for b in every) <= _WARM_TAILS_S else profiled
