"""Start-up outside bubbles (issue #31): every slice's claim, recovery, workload setup and first call of each batch
size happen between bubbles, before the slice's first, as the executor's event log shows."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from fill_helpers import fill_on_one_cpu, write_job

from pipefill.events import FillEvent, JobEvent, StartupEvent

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
        worked = [b for b in bubbles if b.steps and b.open_ns >= s.start_ns]
        assert worked and worked[0].woke_ns >= s.end_ns  # its first steps come after it
    assert sum(b.items for b in bubbles) >= 256
