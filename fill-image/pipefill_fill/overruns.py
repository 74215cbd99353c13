"""Why a bubble overran, and the margin a job whose steps overrun is planned with.

An overrun is how long after the bubble's expected end the fill yielded. Past the guard, its cause is the piece of
work that held the device longest past the expected end:

* ``step`` — a step that ran past its prediction (the step model sized it to the time left);
* ``start-up`` — a first call: a profiling step, or a step of a batch size the slice had not run yet (lazy
  initialization, allocations, kernels chosen for a new shape);
* ``commit`` — a commit's device part (:mod:`pipefill_fill.commits`);
* ``transfer`` — offload mode's copy of the job's state to or from the device;
* ``yield`` — none of these: the time between the last piece of work and the yield (the executor's own code, or the
  process descheduled);
* ``preempted`` — the trainer took its core back (:func:`took_core`): the executor runs at the kernel's idle priority
  on the trainer's core (a CPU device), the bubble closed before the fill yielded, and the filling thread lost its
  core meanwhile (involuntary context switches, :mod:`pipefill_fill.steptrace`). There the kernel gives the trainer
  its core the moment it wakes, so whatever the fill was doing (a step, a commit, its own code) was suspended, not
  holding the device: the trainer did not wait for it. In ``make demo`` 12 and 13 of 15 bubbles past the guard were
  this in two runs (the bubble had closed 0.1–9 ms before its predicted end, and the trainer's next action began
  within 0.1 ms of the close).

:class:`Margin` learns how far a job's last step of a bubble ran past the deadline it was sized for, and plans the
job's bubbles that much earlier where the guard does not cover it (a workload whose step times vary more than the
step model predicts: data-dependent shapes, a shared device). It is sized by the steps' own rule
(:mod:`pipefill_fill.predict`): the smallest margin whose *expected* overrun past the room left is within the overrun
budget, not a high quantile. A 99th percentile of 128 bubbles is the second worst of them: on a shared core two
steps descheduled for 2 ms set a 2 ms margin on 4–6 ms bubbles, which cost a third of every bubble (the co-location
benchmark's recovery fell from 0.74 to 0.45 at m = 4 with it) to save 30 µs of expected overrun.
"""

from __future__ import annotations

from collections import deque

from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.metrics import OVERRUN_CAUSES
from pipefill_fill.predict import OVERRUN_BUDGET_S

__all__ = ["OVERRUN_CAUSES", "Margin", "overrun_cause", "took_core"]


def overrun_cause(out: BubbleOutcome, *, expected_end_ns: int, yielded_ns: int, preempted: bool = False) -> str:
    """The piece of ``out`` that ran longest in ``[expected_end_ns, yielded_ns]`` (see the module docstring);
    ``preempted``: the trainer took its core back before the fill yielded (the runner knows: :func:`took_core`)."""
    if preempted:
        return "preempted"
    pieces = [(s, e, "start-up" if i in out.startup_steps else "step") for i, (s, e) in enumerate(out.spans_ns)]
    pieces += [(s, e, "commit") for s, e in out.commits_ns]
    pieces += [(s, e, "transfer") for s, e in out.transfers_ns]
    best, cause = 0, "yield"
    for s, e, what in pieces:
        past = min(e, yielded_ns) - max(s, expected_end_ns)
        if past > best:
            best, cause = past, what
    return cause


def took_core(*, preemptible: bool, closed_ns: int, yielded_ns: int, involuntary: int) -> bool:
    """Whether the trainer took its core back from the fill before it yielded: the executor runs at idle priority on
    the trainer's core (``preemptible``), the bubble closed before the yield (``closed_ns``; 0: still open) and the
    filling thread lost its core during the bubble (``involuntary`` context switches, :mod:`pipefill_fill.steptrace`)."""
    return preemptible and 0 < closed_ns < yielded_ns and involuntary > 0


class Margin:
    """The extra margin (seconds) a job's bubbles are planned with, from how far the last step of its worked bubbles
    among the last ``window`` bubbles it was offered ran past the deadline it was sized for, less the room the plan
    already leaves (guard, planned end): the smallest margin ``m`` ≥ 0 whose expected overrun over them, the mean of
    ``max(0, past − m)``, is within ``budget_s`` (the executor's overrun budget); 0 while fewer than ``warm`` of them
    were worked. Start-up steps stay out (they are one-off), and so do interrupted ones
    (``BubbleOutcome.interrupted``: more than :data:`pipefill_fill.predict.INTERRUPTED` times their base, as the step
    model leaves them out of its quantiles): one step a VM's host stalled 10 ms past its deadline would set a 3.6 ms
    margin (10 ms less the 6.4 ms the budget allows over 128 bubbles) on every one of the job's next 128 bubbles. A
    job whose steps overrun by a steady amount is planned that much earlier; one whose steps overran twice in a
    hundred bubbles, by whatever amount, costs at most ``budget_s`` a bubble on average and keeps its bubbles.

    The window counts offered bubbles, not worked ones: a margin that leaves no step room in the bubbles would
    otherwise see no new bubble and keep its outlier for ever (a 1.8 ms margin on 3.7 ms bubbles held a job at one
    sample per 30 s). So an outlier ages out after ``window`` bubbles, and the job tries again."""

    def __init__(self, *, window: int = 128, warm: int = 16) -> None:
        self.warm, self.window = warm, window
        # (the offered bubble's number, its last step's end − its deadline in s; negative: it ended early)
        self._past: deque[tuple[int, float]] = deque()
        self._offered = 0
        self.warned = False

    def record(self, out: BubbleOutcome, *, deadline_ns: int, room_ns: int) -> None:
        """A bubble ``out`` whose steps were sized to end by ``deadline_ns``, ``room_ns`` before the expected end
        (with no step: offered, not worked)."""
        self._offered += 1
        while self._past and self._past[0][0] <= self._offered - self.window:
            self._past.popleft()
        last = len(out.spans_ns) - 1 - out.continued  # pieces run on past the planned end were not planned to end
        if last < 0 or last in out.startup_steps or last in out.interrupted:
            return
        self._past.append((self._offered, (out.spans_ns[last][1] - deadline_ns - room_ns) / 1e9))

    def extra_s(self, budget_s: float = OVERRUN_BUDGET_S) -> float:
        if len(self._past) < self.warm:
            return 0.0
        past = sorted((v for _, v in self._past), reverse=True)
        allowed = budget_s * len(past)  # the sum of overruns the budget allows
        # the excess sum(max(0, v − m)) falls as m rises; between the (k+1)-th and the k-th largest value it is
        # top(k) − k·m: the first k whose crossing of ``allowed`` lies in its interval gives the margin
        top = 0.0
        for k, value in enumerate(past, start=1):
            top += value
            lower = max(past[k] if k < len(past) else 0.0, 0.0)
            if (top - allowed) / k >= lower or lower == 0.0:
                return max(0.0, (top - allowed) / k)
        return 0.0

    def mean_past_s(self) -> float:
        """The mean overrun past the room left over the bubbles kept (0 where none was late)."""
        return sum(max(0.0, v) for _, v in self._past) / len(self._past) if self._past else 0.0

    def __len__(self) -> int:
        return len(self._past)
