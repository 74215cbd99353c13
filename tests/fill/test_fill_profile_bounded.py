"""A profile ends within a bounded number of bubbles and never keeps a job from working (issue #25, "Found while
measuring"; issue #30 item 2): a measurement that fits a fresh bubble but never the time left after the wake-up is
given up, and a job works with the batch sizes measured so far while the larger ones are measured."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from commit_helpers import dispatcher
from fill_helpers import fill_on_one_cpu, write_job

from pipefill.events import CommitEvent, FillEvent, JobEvent, ProfileEvent
from pipefill_fill.inprofile import PROFILE_MISSES, due_between, run_profile_steps
from pipefill_fill.predict import StepModel

pytestmark = pytest.mark.alone  # times a quiet core (tests/sharing.py)

MS = 1_000_000


@dataclass
class _Bubble:
    id: int
    open_ns: int
    expected_end_ns: int


class _Profiler:
    """The part of :class:`BubbleProfiler` the in-bubble loop uses, with a fixed bound on each measurement."""

    def __init__(self, guess_s: float | None, *, measured: bool) -> None:
        self.guess_s, self.measured = guess_s, measured
        self.result: object | None = None
        self.misses = 0
        self.measurements = 0

    mid_step = False  # whole steps: a measurement is one step, no pieces
    retry_due = False  # no dropped measurement to take again between bubbles
    productive, last_items, batch_size = False, 0, 1  # measurements that do no work (a training job's)

    def out_of_work(self) -> bool:
        return False

    def bound_s(self) -> float | None:
        return self.guess_s

    next_bound_s = bound_s

    def measure_one(self) -> float:
        self.measurements += 1
        self.result = "measured"  # one measurement completes this profile
        return self.guess_s or 0.0

    measure_next = measure_one

    def give_up_candidate(self) -> None:
        self.result = "given up"


def _bubbles(profiler: _Profiler, *, woke_after_ns: int, limit: int = 100) -> int:
    """Bubbles of 20 ms (deadline 19.5 ms after the open) until the profile ends; the executor wakes
    ``woke_after_ns`` after each open."""
    for i in range(limit):
        open_ns = i * 100 * MS
        out = run_profile_steps(
            _Bubble(i, open_ns, open_ns + 20 * MS),  # type: ignore[arg-type]
            profiler=profiler,  # type: ignore[arg-type]
            is_open=lambda _id: True,
            deadline_ns=open_ns + 19_500_000,
            clock=lambda open_ns=open_ns: open_ns + woke_after_ns,  # type: ignore[misc]
        )
        if profiler.result is not None:
            return i + 1
        assert out.stop == "time" and not out.steps
    return limit + 1


def test_a_measurement_that_fits_only_a_fresh_bubble_is_given_up_after_the_bounded_misses() -> None:
    # the stall of bench fill: 19.45 ms predicted, a 19.5 ms deadline, the executor awake 0.12 ms after the open
    profiler = _Profiler(0.01945, measured=True)
    assert _bubbles(profiler, woke_after_ns=120_000) == PROFILE_MISSES
    assert profiler.result == "given up" and profiler.measurements == 0


def test_the_first_size_that_fits_no_bubble_is_measured_between_them_never_in_one() -> None:
    """Nothing measured yet: giving the size up would leave no profile. It was measured at the next bubble's start
    whatever its prediction, and overran that bubble by what it did not fit; now it is due between bubbles."""
    profiler = _Profiler(0.050, measured=False)
    assert _bubbles(profiler, woke_after_ns=120_000, limit=3 * PROFILE_MISSES) == 3 * PROFILE_MISSES + 1
    assert profiler.result is None and profiler.measurements == 0  # no bubble ran it
    assert due_between(profiler)  # type: ignore[arg-type]
    fits = _Profiler(0.010, measured=False)  # the same with a prediction that fits: measured in the first bubble
    assert _bubbles(fits, woke_after_ns=120_000) == 1 and not due_between(fits)  # type: ignore[arg-type]
    unknown = _Profiler(None, measured=False)  # nothing predicts it: between bubbles at once
    assert due_between(unknown) and _bubbles(unknown, woke_after_ns=0, limit=2) == 3  # type: ignore[arg-type]


PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 2, 4096]}


@pytest.mark.slow
def test_a_job_works_and_commits_with_its_first_measured_sizes_before_its_profile_is_complete(tmp_path: Path) -> None:
    """Batch 4096 fits no 20 ms bubble: while the profile gives it up, the sizes measured already do the work, and the
    first samples are committed within the job's first bubbles, before the profile record."""
    jobs = tmp_path / "jobs"
    write_job(jobs, "early", total=100_000, parameters=PARAMS)
    events = fill_on_one_cpu(
        tmp_path, jobs, lambda evs: any(isinstance(e, ProfileEvent) for e in evs), "a profile record"
    )
    profile = next(e for e in events if isinstance(e, ProfileEvent))
    assert [p["batch_size"] for p in profile.points] == [1, 2]  # 4096 given up
    before = [e for e in events if e.mono_ns < profile.mono_ns]
    bubbles = [e for e in before if isinstance(e, FillEvent) and e.job == "early"]
    worked = [b for b in bubbles if b.items]
    assert worked, "no work before the profile was complete"
    assert all(s in (0, 1, 2) for b in bubbles for s in b.batch_sizes)  # measured sizes only (0: measuring)
    first_commit = next((e for e in before if isinstance(e, CommitEvent)), None)
    assert first_commit is not None and first_commit.end > 0, "nothing committed before the profile was complete"
    running = next(e for e in events if isinstance(e, JobEvent) and e.phase == "Running")
    in_between = [b for b in bubbles if running.mono_ns < b.mono_ns < first_commit.mono_ns]
    assert len(in_between) <= 2 * PROFILE_MISSES, f"first commit after {len(in_between)} bubbles"


class _MidStep:
    """A profiler measuring a step in pieces, one in flight from an earlier bubble: the next piece fits this bubble,
    the one after it does not."""

    def __init__(self) -> None:
        self.result: object | None = None
        self.misses, self.measured, self.mid_step, self.paused, self.pieces = 0, True, True, 0, 0
        self.retry_due = False
        self.points: tuple[object, ...] = ()
        self.productive, self.last_items, self.batch_size = False, 0, 1

    def out_of_work(self) -> bool:
        return False

    def next_bound_s(self) -> float:
        return 1.0 if self.pieces else 1e-6

    def measure_next(self) -> float:
        self.pieces += 1
        return 0.0

    def pause(self) -> None:
        self.paused += 1
        self.mid_step = False  # as BubbleProfiler.pause: the state goes back, the batch in flight with it


def test_a_step_measured_in_pieces_goes_on_in_the_next_bubble(tmp_path: Path) -> None:
    """A job with a size measured already works with it where the next measurement does not fit what is left of a
    bubble — but not while a step is being measured in pieces: that work would put the state back and drop the
    measurement's batch in flight, and the measurement would start again in every bubble (sentence-embedding at
    20 ms bubbles: 7 000 bubbles, two pieces measured in each, nothing committed)."""
    profiler = _MidStep()
    task = SimpleNamespace(spec=SimpleNamespace(kind="inference", workload_id="w"), workload=object())
    job = SimpleNamespace(
        task=task, profile=None, profile_taken=False, profiler=profiler, early_model=lambda: StepModel({1: 1e-3})
    )
    fill = dispatcher(tmp_path, SimpleNamespace(active={"j": job}, generation=1, step_clock=None)).fill  # type: ignore[arg-type]
    now = time.monotonic_ns()
    bubble = _Bubble(0, now, now + 10 * MS)
    name, why, out, _ = fill(bubble, bubble.expected_end_ns, 0.01)
    assert (name, why, out.stop, out.steps) == ("j", "profiling", "profiling", 1)
    assert profiler.paused == 0 and profiler.mid_step  # its batch in flight kept for the next bubble
