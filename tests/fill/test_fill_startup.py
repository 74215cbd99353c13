"""Start-up outside bubbles (issue #31): every slice's claim, recovery, workload setup and first call of each batch
size happen between bubbles, before the slice's first, as the executor's event log shows."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from fill_helpers import fill_on_one_cpu, write_job

from pipefill.events import FillEvent, JobEvent, MeasureEvent, StartupEvent

pytestmark = pytest.mark.slow

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16]}


def test_start_up_never_runs_inside_a_bubble(tmp_path: Path) -> None:
    jobs, out = tmp_path / "jobs", tmp_path / "out" / "enc"
    write_job(jobs, "enc", total=256, parameters=PARAMS, output=out, max_parallel_ranks=2)  # 4 slices, one by one
    events = fill_on_one_cpu(
        tmp_path, jobs, lambda evs: any(isinstance(e, JobEvent) and e.job == "enc" and e.phase == "Succeeded" for e in evs),
        "job enc to succeed",
    )  # fmt: skip
    startups = [e for e in events if isinstance(e, StartupEvent)]
    bounds = json.loads((out / "slices.json").read_text())["bounds"]  # [0, 64, 128, ...]
    assert sorted((s.slice[0], s.slice[1]) for s in startups) == list(itertools.pairwise(bounds))
    assert startups[0].batch_sizes == [1, 4, 16]  # before the profile: every candidate once
    assert all(s.batch_sizes for s in startups[1:])  # later slices: the profile's sizes
    bubbles = [e for e in events if isinstance(e, FillEvent) and e.job == "enc"]
    for s in startups:
        inside = [b.id for b in bubbles if b.woke_ns < s.end_ns and s.start_ns < b.yielded_ns]
        assert not inside, f"slice {s.slice}: its start-up overlapped bubbles {inside}"
        # the bubbles taken once it began (one may have opened before it, while the executor still ended the last
        # slice: under load a slice of 64 samples was all done in such a bubble, taken after its start-up)
        worked = [b for b in bubbles if b.steps and b.woke_ns >= s.start_ns]
        assert worked and worked[0].woke_ns >= s.end_ns  # its first steps come after it
    # every sample once: in bubbles, or in a profile's measured steps between them (an inference job's are its work)
    measured = sum(e.items for e in events if isinstance(e, MeasureEvent) and e.job == "enc")
    assert sum(b.items for b in bubbles) + measured == 256


LARGE = {"layers": 1, "hiddenSize": 256, "heads": 4, "seqLen": 256, "batchSizes": [4]}  # one piece of ~40 ms


def test_a_first_size_that_fits_no_bubble_is_measured_between_them_and_the_job_found_unfit(tmp_path: Path) -> None:
    """Its one piece is longer than the 20 ms bubbles: measured in them whatever its prediction, it overran each by
    20 ms or more before the verdict (issue #31: up to 9.8 ms past 2 ms bubbles, 14–42 bubbles a job). Measured
    between them, no bubble runs any of it, and the job is given up for this rank with its measured step."""
    jobs = tmp_path / "jobs"
    write_job(jobs, "big", total=4096, parameters=LARGE)
    events = fill_on_one_cpu(
        tmp_path, jobs, lambda evs: any(isinstance(e, JobEvent) and e.phase == "Queued" for e in evs), "a verdict"
    )
    verdict = next(e for e in events if isinstance(e, JobEvent) and e.phase == "Queued")
    assert verdict.message is not None and verdict.message.startswith("no bubble long enough"), verdict.message
    measures = [e for e in events if isinstance(e, MeasureEvent) and e.job == "big"]
    assert len(measures) >= 7 and all(m.batch_size == 4 and m.step_s > 0.02 for m in measures[2:]), measures
    bubbles = [e for e in events if isinstance(e, FillEvent) and e.job == "big"]
    assert bubbles and not [b.id for b in bubbles if b.steps], "a measurement ran inside a bubble"
    for m in measures:  # between bubbles: none the executor was filling
        inside = [b.id for b in bubbles if b.woke_ns < m.end_ns and m.start_ns < b.yielded_ns]
        assert not inside, f"a measurement overlapped bubbles {inside}"
