"""The bubble hook on a plain torch.distributed.pipelining script (examples/pipelining/train.py), 2 gloo ranks:
every schedule torch 2.13 offers and a CSV schedule. Hooked, bubbles are predicted from the schedule's own order
(simulated), announced, and a consumer on each channel receives them; the losses are those of the unhooked run,
bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hook_procs import run_example

from pipefill.schedules.csvio import dump_csv
from pipefill.schedules.generators import build_schedule

pytestmark = pytest.mark.slow

SCHEDULES: list[tuple[str, list[str]]] = [
    ("GPipe", []),
    ("1F1B", []),
    ("Interleaved1F1B", []),
    ("LoopedBFS", []),
    ("InterleavedZeroBubble", []),
    ("ZBVZeroBubble", []),
    ("DualPipeV", []),
]
STEPS = 16
# a narrower model than the example's default (its bubbles are for a fill to use; here nothing fills and every
# predicted bubble is announced, FILL_MIN_BUBBLE_MS 0): 2.9 s a run instead of 4.0
SMALL = ["--width", "256", "--batch", "64"]


def _check(tmp: Path, args: list[str]) -> None:
    args = [*args, *SMALL]
    plain = run_example(tmp / "plain", args, hook=False)
    hooked = run_example(tmp / "hooked", args, hook=True)
    assert hooked.losses == plain.losses, "the hook changed what the training computes"
    assert len(plain.losses) == STEPS
    for rank, r in enumerate(hooked.ranks):
        assert "bubbles simulated" in r.output, f"rank {rank}: the schedule's order was not used:\n{r.output}"
        announced = [b for b in r.bubbles() if b.announced]
        assert announced, f"rank {rank}: no bubble announced:\n{r.output}"
        assert {b.id for b in r.received}, f"rank {rank}: the consumer received none of {len(announced)} bubbles"
        assert len(r.received) <= len(announced)
        assert [s.step for s in r.steps()] == list(range(STEPS))
        # the hook's own time of every step: its wrappers ran (each step has actions and waits), within the step
        assert all(s.hook_s is not None and 0 < s.hook_s < s.step_s for s in r.steps()[1:]), r.steps()
        assert min(b.step for b in announced) >= 3, "a bubble announced while profiling"
    assert (hooked.ranks[0].out_dir / "profile.json").is_file()


@pytest.mark.parametrize("schedule,extra", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_every_torch_schedule_is_announced_and_computes_the_same(
    tmp_path: Path, schedule: str, extra: list[str]
) -> None:
    _check(tmp_path, ["--schedule", schedule, "--microbatches", "4", "--steps", str(STEPS), *extra])


def test_a_csv_schedule_is_announced_and_computes_the_same(tmp_path: Path) -> None:
    csv = tmp_path / "zb.csv"
    csv.write_text(dump_csv(build_schedule("zero-bubble-h1", ranks=2, microbatches=4)))
    _check(tmp_path, ["--csv", str(csv), "--microbatches", "4", "--steps", str(STEPS)])


def test_a_steps_records_are_written_inside_a_wait_of_the_next_step(tmp_path: Path) -> None:
    """The example's own width (1F1B bubbles of 3–6 ms): once the hook announces, a step's records and metrics are
    written in a wait of the next step, before its bubble is announced, not at its start (where they delayed the first
    action); every step's records are still in the log, the last one's written at exit."""
    run = run_example(tmp_path, ["--schedule", "1F1B", "--microbatches", "4", "--steps", str(STEPS)], hook=True)
    for rank, r in enumerate(run.ranks):
        steps = r.steps()
        assert [s.step for s in steps] == list(range(STEPS)), f"rank {rank}: {steps}"
        start = {s.step: s.start_ns for s in steps}
        # step 3 announces first; its books are the first a wait of the next step can take
        deferred = [s.step for s in steps if s.step >= 4 and (s.hook_wait_s or 0) > 0]
        assert len(deferred) >= (STEPS - 4) // 2, f"rank {rank}: books written in waits only at steps {deferred}"
        for k in deferred:
            written = [b.mono_ns for b in r.bubbles() if b.step == k - 1]
            assert written and min(written) > start[k], f"rank {rank}: step {k - 1}'s bubbles written before step {k}"
        assert all(s.hook_wait_s == 0 for s in steps if s.step < 4), steps
