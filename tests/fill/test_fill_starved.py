"""A profiled job whose steps and pieces (almost) never fit what its bubbles leave is given up for this rank after a
bounded number of bubbles (pipefill_fill.unfit.STARVED_BUBBLES, STARVED_SHARE), with the numbers, instead of taking
bubbles for ever. `pipefill bench fill --life` at 2 ms found the encoder's job taking 12 692 bubbles with steps in 14:
its shortest unit passed the check at its profile (it is shorter than the bubble less the guard), but not the
planner's (the wake-up, the learnt margin), so no verdict ever came."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from commit_helpers import Bubble, cpu_jobs, dispatcher
from fill_helpers import write_job

from pipefill import env
from pipefill.events import EventWriter
from pipefill.plan import ObservedBubble
from pipefill.queue import Identity
from pipefill.spec.fillstatus import UnfitReason
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.jobs import Jobs
from pipefill_fill.sources import open_source
from pipefill_fill.unfit import STARVED_BUBBLES, STARVED_SHARE, starved_report

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4]}


def test_the_report_names_the_counts_the_unit_and_the_usable_bubble() -> None:
    bubbles = [ObservedBubble(0.002, 1 << 30, "F")] * 40
    report = starved_report(500, 12, 0.0012, bubbles, identity=Identity("gpt", 1), free_bytes=1 << 30, guard_s=5e-4)
    assert report.reason == UnfitReason.BUBBLE_TOO_SHORT and (report.training_job, report.rank) == ("gpt", 1)
    assert report.step_milliseconds == 1.2 and report.longest_bubble_milliseconds == 1.5
    assert report.message == (
        "no bubble long enough: nothing of the job fitted the time left in 500 of its last 512 bubbles (after the "
        "wake-up, the guard and the step's learnt margin); its shortest step or piece takes 1.200 ms, this rank's "
        "longest usable bubble is 1.500 ms"
    )


Fill = Callable[[int, float], tuple[str | None, BubbleOutcome]]


@contextlib.contextmanager
def _profiled(tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Jobs, Fill, int]]:
    """The executor's jobs with job ``j`` profiled in long bubbles; a function that fills bubble ``i`` of a length
    through the dispatcher (and the jobs' ``after_bubble``), and the next bubble's index."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    write_job(jobs_dir, "j", total=10**5, parameters=PARAMS, output=tmp_path / "out" / "j")
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = cpu_jobs(source, EventWriter(None))
    try:
        jobs.refresh()
        fill = dispatcher(tmp_path, jobs).fill

        def bubble(i: int, length_s: float) -> tuple[str | None, BubbleOutcome]:
            now = time.monotonic_ns()
            b = Bubble(i, now, now + int(length_s * 1e9))
            job, _why, out, _batch = fill(b, b.expected_end_ns, length_s)
            if job is not None:
                jobs.after_bubble(job, out)
            return job, out

        i = 0
        while (a := jobs.active["j"]).profile is None or not a.profile_taken:  # profiled in long bubbles
            bubble(i, 0.2)
            i += 1
            assert i < 200, "the profile was never completed"
        yield jobs, bubble, i
    finally:
        jobs.shutdown()
        source.close()


def test_a_job_nothing_of_which_fits_its_bubbles_is_left_for_another_executor(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _profiled(tmp_path, jobs_dir, monkeypatch) as (jobs, bubble, i):

        def window(worked: int) -> None:  # STARVED_BUBBLES bubbles: ``worked`` it runs steps in, the rest too short
            nonlocal i
            for n in range(STARVED_BUBBLES):
                short = n >= worked
                job, out = bubble(i, 20e-6 if short else 0.01)
                i += 1
                assert job == "j" or "j" not in jobs.active, (n, job, out)
                assert not short or (not out.steps and out.stop == "time") or "j" not in jobs.active, (n, out)
                assert short or out.steps, (n, out)

        least = math.ceil(STARVED_SHARE * STARVED_BUBBLES)
        window(least)  # steps in one bubble in 32: enough, the count starts over
        assert "j" in jobs.active, f"given up with steps in {least} of {STARVED_BUBBLES} bubbles"
        window(least - 1)
        assert "j" not in jobs.active and "j" in jobs.failed, f"not given up with steps in {least - 1}"
        status = json.loads((jobs_dir / "j.status.json").read_text())
        assert status["phase"] == "Queued", status
        starved = STARVED_BUBBLES - least + 1
        assert f"fitted the time left in {starved} of its last {STARVED_BUBBLES} bubbles" in status["message"], status
        assert status["unfit"][0]["reason"] == UnfitReason.BUBBLE_TOO_SHORT.value, status


def test_a_job_whose_pieces_run_but_complete_no_batch_is_left_for_another_executor(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces in one bubble in four, each batch dropped before its last piece (a later one fitted no bubble): steps in
    far more than one bubble in 32, nothing done. `bench fill --life` at 2 ms: train-classifier ran so for 400 s."""
    with _profiled(tmp_path, jobs_dir, monkeypatch) as (jobs, _bubble, _i):
        pieces = BubbleOutcome(steps=1, pieces=1, items=0, stop="time")  # a piece ran; its batch is not complete
        nothing = BubbleOutcome(stop="time")
        done = BubbleOutcome(steps=1, pieces=1, items=4, stop="time")  # the last piece of a batch

        def window(*, batches: int) -> None:
            for n in range(STARVED_BUBBLES):
                jobs.after_bubble("j", done if n < batches else pieces if n % 4 == 0 else nothing)

        window(batches=1)  # one batch in 512 bubbles: it progresses, the count starts over
        assert "j" in jobs.active
        window(batches=0)
        assert "j" not in jobs.active and "j" in jobs.failed
        status = json.loads((jobs_dir / "j.status.json").read_text())
        assert status["phase"] == "Queued", status
        assert (
            f"ran pieces in {STARVED_BUBBLES // 4} of its last {STARVED_BUBBLES} bubbles and completed no batch"
            in (status["message"])
        ), status
