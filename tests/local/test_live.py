"""The live view of `pipefill local`: incremental reading of growing logs, the figures it shows (the report's own),
plain lines into a pipe, a rich table on a terminal, and Ctrl-C under the live display."""

from __future__ import annotations

import io
import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import launched
import pytest
import yaml
from manifests import fill_job
from rich.console import Console
from test_local_run import _job
from waiting import wait_for

from pipefill.events import CommitEvent, EventWriter, FillEvent, JobEvent, StepEvent, read_events
from pipefill.local.live import LiveState, PlainView, RichView
from pipefill.local.report import build_report, rank_log_paths
from pipefill.local.runner import RunOutcome
from pipefill.spec import FillJob, load_file, load_training_job

pytestmark = pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)

LOCAL = [sys.executable, "-m", "pipefill", "local"]
STEPS = 60
FILL_TOTAL = 256


def _fill(tmp: Path) -> Path:
    doc = fill_job(
        "embed-tiny", output=str(tmp / "fill-out"), parameters={"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16},
        totalSamples=FILL_TOTAL, hostSelector={"matchLabels": {"pipefill.io/fill-pool": "demo"}},
    )  # fmt: skip
    path = tmp / "fill.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A tiny job with a fill job, run to the end with stdout into a pipe (so: plain lines)."""
    tmp = tmp_path_factory.mktemp("plain")
    out = tmp / "out"
    job_file = _job(tmp, steps=STEPS, fill=True)
    job = yaml.safe_load(job_file.read_text())
    # the demo's model size: the tiniest model's bubbles (~1 ms) are too short for any fill step, so fill may never run
    job["spec"]["model"] = {"layers": 4, "hiddenSize": 128, "heads": 4, "seqLen": 64, "vocabSize": 256}
    job_file.write_text(yaml.safe_dump(job))
    manifests = ["-f", str(job_file), "-f", str(_fill(tmp))]
    done = launched.run(
        [*LOCAL, *manifests, "--out", str(out), "--status-every", "0.5", "--metrics-port", "0", "--no-timeline"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    return out, done


@pytest.mark.slow
def test_plain_lines_into_a_pipe_show_steps_and_fill_progress(
    plain_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = plain_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b" not in done.stdout  # no terminal escape codes into a pipe
    status = [line for line in done.stdout.splitlines() if "rank 0: " in line and "rank 1: " in line]
    steps = [int(m) for line in status for m in re.findall(rf"rank 0: step (\d+)/{STEPS}", line)]
    assert steps, done.stdout
    assert steps == sorted(steps)
    assert steps[-1] == STEPS
    lines = done.stdout.splitlines()
    finished = next(i for i, line in enumerate(lines) if "Normal TrainingFinished: every rank's trainer" in line)
    assert any("rank 0: step" in line for line in lines[:finished])  # lines while it trains, not only at the end
    final = status[-1]  # printed after the processes stopped: the fill's last commit is in
    assert all("fill embed-tiny " in line for line in status)
    status_file = json.loads((out / "filljobs" / "embed-tiny.status.json").read_text())
    assert f"fill embed-tiny {status_file['samplesDone']}/{FILL_TOTAL} {status_file['phase']}" in final
    last_loss = [e for e in read_events(rank_log_paths(out, 0)[0]) if isinstance(e, StepEvent)][-1].loss
    assert f"loss {last_loss:.3f}" in final
    # an executor that stops because its own trainer finished is not restarted (its pod's sidecar would not be)
    assert (
        "restarted" not in done.stdout
        and json.loads((out / "report.json").read_text())["outcome"]["fill_restarts"] == 0
    )


@pytest.mark.slow
def test_live_figures_fed_in_random_pieces_equal_the_report(
    plain_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """The real logs of the tiny run, copied piece by piece (lines cut anywhere) while the view polls."""
    out, _ = plain_run
    job = load_training_job(out / "job.yaml")
    growing = tmp_path / "growing"
    state = LiveState(world_size=2, out_dir=growing, work_dir=growing / "filljobs", fills=[], steps=STEPS)
    outcome = RunOutcome(code=1, reason="running")
    rng = random.Random(7)
    for rank in range(2):
        for src, dst in zip(rank_log_paths(out, rank), rank_log_paths(growing, rank), strict=True):
            data = src.read_bytes()
            dst.parent.mkdir(parents=True, exist_ok=True)
            pos = 0
            while pos < len(data):
                step = rng.randint(1, 400)
                with dst.open("ab") as fh:
                    fh.write(data[pos : pos + step])
                pos += step
                state.poll([], outcome)
    state.poll([], outcome, final=True)
    report = build_report(job, out, outcome={})
    for rank in range(2):
        assert {"rank": rank, **state.ranks[rank].summary()} == report["ranks"][rank]
    assert (
        state.ranks[0].last_step == [e for e in read_events(rank_log_paths(out, 0)[0]) if isinstance(e, StepEvent)][-1]
    )
    # both sides of the sums were exercised: bubbles measured, and fill work in some of them (on either rank)
    assert all(r["steps_measured"] > 0 for r in report["ranks"])
    assert sum(r["fill_bubbles_used"] for r in report["ranks"]) > 0


def test_overrun_warnings_and_runner_events_are_said_once(tmp_path: Path) -> None:
    _, fill_log = rank_log_paths(tmp_path, 0)
    log = EventWriter(fill_log)

    def bubble(wait_s: float, cause: str | None = None, *, overrun_s: float | None = None) -> None:
        closed = 10**9 if wait_s else 0  # 0: still open when the fill yielded
        log.write(
            FillEvent(
                id=0, kind="steady", open_ns=0, expected_end_ns=1, woke_ns=0, yielded_ns=closed + int(wait_s * 1e9),
                steps=2, items=2, used_s=1e-9, overrun_s=wait_s if overrun_s is None else overrun_s,
                overrun_cause=cause, closed_ns=closed, trainer_wait_s=wait_s,
            )
        )  # fmt: skip

    bubble(0.050)  # written before the view started: history
    written_s = read_events(fill_log)[0].wall_s
    while time.time() <= written_s:  # the view starts strictly later (a coarse clock may need a moment)
        pass
    state = LiveState(world_size=1, out_dir=tmp_path, work_dir=tmp_path, fills=[], steps=1)
    bubble(0.0002)
    bubble(0.004)
    outcome = RunOutcome(code=1, reason="running", events=["12:00:00 rank0/fill-executor exited 1: restarted"])
    first = state.poll([], outcome)
    assert first[0] == outcome.events[0]
    # a wait before the view started is history; one below the threshold is not worth a line
    assert len(first) == 2 and "trainer waited for the fill after 1 bubble(s), worst 4.0 ms" in first[1]
    assert "(overran by" not in first[1]  # no cause recorded (below the executor's guard)
    bubble(0.003, "commit")
    bubble(0.007, "step")
    bubble(0.009, "step")
    bubble(0.0, "preempted", overrun_s=0.020)  # the trainer took its core back: the fill held nothing, no warning
    bubble(0.0, "step", overrun_s=0.030)  # past the expected end, but the trainer was still idle: no warning
    log.close()
    assert state.poll([], outcome) == []  # within the rate limit: held back
    last = state.poll([], outcome, final=True)
    assert len(last) == 1, last
    assert (
        "waited for the fill after 3 bubble(s), worst 9.0 ms past the bubble's close (overran by step 2, commit 1)"
        in last[0]
    )


@pytest.mark.slow
def test_rich_view_draws_ranks_and_fill_progress(plain_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = plain_run
    fills = [m for m in load_file(out.parent / "fill.yaml") if isinstance(m, FillJob)]
    state = LiveState(world_size=2, out_dir=out, work_dir=out / "filljobs", fills=fills, steps=STEPS)
    buf = io.StringIO()
    view = RichView(state, console=Console(file=buf, force_terminal=True, width=120, color_system="standard"))
    view.tick([], RunOutcome(code=1, reason="running", events=["12:00:00 all trainers finished"]))
    view.close(RunOutcome(code=0, reason="training finished"))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "\x1b[" in buf.getvalue()
    assert "tokens/s" in text and "fill executor" in text
    committed = json.loads((out / "filljobs" / "embed-tiny.status.json").read_text())["samplesDone"]
    assert re.search(rf"embed-tiny\s+\S+\s+{committed}/{FILL_TOTAL}", text), text
    assert re.search(rf"│\s+1 │ {STEPS}/{STEPS} │", text), text
    assert "12:00:00 all trainers finished" in text
    plain = PlainView(state, out=io.StringIO())
    assert f"rank 1: step {STEPS}/{STEPS}" in plain.status_line()


@pytest.mark.slow
def test_ctrl_c_under_the_terminal_view_stops_everything_and_restores_the_terminal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    master, slave = pty.openpty()
    argv = [*LOCAL, "-f", str(_job(tmp_path, steps=100000, fill=False)), "--out", str(out), "--metrics-port", "0",
            "--no-timeline"]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm"},
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the last writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    events = out / "ranks" / "0" / "trainer" / "events.jsonl"
    wait_for(lambda: sum(isinstance(e, StepEvent) for e in read_events(events)) >= 4, "4 steps", timeout_s=90)
    time.sleep(0.5)  # a few ticks of the view with steps in it
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    reader.join(timeout=10)
    os.close(master)
    screen = b"".join(chunks).decode("utf-8", errors="replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "┃ rank ┃" in text  # the live table was drawn
    assert re.search(r"│\s+0 │\s+\d+/100000 │", text), text[-3000:]
    assert "interrupted" in text
    assert screen.rfind("\x1b[?25h") > screen.rfind("\x1b[?25l")  # the cursor is shown again
    children = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert [c for c in children if int(c) != os.getpid()] == []


def test_a_split_jobs_phase_and_total_come_from_its_merged_status_not_the_last_ranks_events(tmp_path: Path) -> None:
    """Rank 1 logged Running after rank 0 finished the job: the merged status file, not rank order, says Succeeded."""
    job = load_training_job(_job(tmp_path, steps=1, fill=True))
    work = tmp_path / "filljobs"
    work.mkdir()
    (work / "embed.yaml").write_text(yaml.safe_dump({"spec": {"totalSamples": 4096}}))
    (work / "embed.status.json").write_text(json.dumps({"phase": "Succeeded", "samplesDone": 4096}))
    for rank, events in enumerate(
        [
            [CommitEvent(job="embed", end=4096, bytes=1, commit_s=0.0), JobEvent(job="embed", phase="Succeeded")],
            [CommitEvent(job="embed", end=2048, bytes=1, commit_s=0.0), JobEvent(job="embed", phase="Running")],
        ]
    ):
        with EventWriter(rank_log_paths(tmp_path, rank)[1]) as log:
            for e in events:
                log.write(e)
    report = build_report(job, tmp_path, outcome={})
    row = report["fill_jobs"]["embed"]
    assert {k: row[k] for k in ("committed", "total", "phase")} == {
        "committed": 4096,
        "total": 4096,
        "phase": "Succeeded",
    }
    assert row["overruns"]["bubbles"] == 0  # no bubble of it in these logs
    # a job of an earlier run (not among this run's manifests) shows its manifest's total in the live view
    state = LiveState(world_size=2, out_dir=tmp_path, work_dir=work, fills=[], steps=1)
    state.poll([], RunOutcome(code=1, reason="running"))
    row = state.fill_jobs["embed"]
    assert (row.committed, row.total, row.phase) == (4096, 4096, "Succeeded")


def test_a_command_jobs_steps_are_its_own_and_its_loss_comes_from_the_rank_that_has_it(tmp_path: Path) -> None:
    """spec.trainer under the hook: no spec.steps to count against, no tokens/s, and only the ranks holding the last
    stage know the loss (rank 0 logs NaN): the view says so, and the report takes rank 1's."""
    job = load_training_job(Path(__file__).resolve().parents[2] / "examples" / "pipelining" / "pipelining-demo.yaml")
    for rank, losses in ((0, [float("nan")] * 3), (1, [2.5, 2.0, 1.5])):
        log = EventWriter(rank_log_paths(tmp_path, rank)[0])
        for step, loss in enumerate(losses):
            log.write(StepEvent(step=step, loss=loss, step_s=0.1, tokens_per_s=0.0, start_ns=step * 10**8))
        log.close()
    state = LiveState(world_size=2, out_dir=tmp_path, work_dir=tmp_path / "filljobs", fills=[], steps=None)
    state.poll([], RunOutcome(code=0, reason="training finished"))
    line = PlainView(state, out=io.StringIO()).status_line()
    assert "rank 0: step 3, loss —, — tokens/s" in line and "rank 1: step 3, loss 1.500, — tokens/s" in line, line
    report = build_report(job, tmp_path, outcome={"code": 0, "reason": "training finished"})
    assert (report["steps"], report["loss_first"], report["loss_last"]) == (3, 2.5, 1.5)
    assert report["tokens_per_s_median"] is None
