"""``pipefill bench fill`` end to end on one core: a synthetic trainer and the fill executor as real processes, idle and
with a process spinning on the other core. Benchmarks are not tests: only the result's shape and sense are checked,
never its speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import launched
import pytest
from sharing import own_core

from pipefill.bench import fill
from pipefill.bench.fill_jobs import stall_report
from pipefill.events import FILL_EVENTS, CommitEvent, EventWriter, FillEvent, JobEvent
from pipefill.local.idle import WORK
from pipefill_fill.metrics import OVERRUN_CAUSES


@pytest.mark.busy  # its busy load spins on the other core; nothing timed is asserted (tests/sharing.py)
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_bench_fill_measures_each_length_and_load_from_the_event_logs() -> None:
    cpu = str(own_core())
    done = launched.run(  # forked from the tests' launcher: so is its own (pipefill/local/forker.py)
        [sys.executable, "-m", "pipefill", "bench", "fill", "--json", "--bubbles-ms", "30", "--bubbles", "40",
         "--loads", "idle,busy", "--layers", "1", "--hidden", "32", "--seq-len", "16", "--cpu", cpu,
         "--timeout-s", "60"],  # a stall: the benchmark's own error, naming what it waited for (not a kill)
        capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert [(r["bubble_ms"], r["load"]) for r in out["runs"]] == [(30, "idle"), (30, "busy")]
    assert out["machine"]["load_avg_1_5_15_start"] and out["guard_ms"] == 0.5 and out["trainer"] == "waits"
    for run in out["runs"]:
        assert run["fill_exit_code"] == 0
        assert run["bubbles"] == 40 and 0 <= run["bubbles_used"] <= run["bubbles"]  # measured after the profile
        assert 0 <= run["recovery"] <= 1.05 and run["samples"] >= 0
        assert run["overrun_p50_ms"] <= run["overrun_p99_ms"] <= run["overrun_max_ms"]
        assert sum(run["idle_share"].values()) == pytest.approx(1.0, abs=1e-3)
        work = sum(run["idle_share"].get(k, 0.0) for k in WORK)  # whole steps, pieces, carried, continued
        assert work == pytest.approx(run["recovery"], abs=1e-3)
        steal = run["steal"]  # the VM's steal on the fill's core: the bubbles it fell in, the overruns without them
        assert steal["available"] and 0 <= steal["bubbles"] <= run["bubbles_used"], steal
        assert steal["overrun_max_ms_without"] <= run["overrun_max_ms"], steal
        assert all("stolen_ms" in w and "last_faults" in w for w in run["worst_overruns"]), run["worst_overruns"]


@pytest.mark.busy  # untimed (beside other tests it stalled: a slice after one that cut its profile short, fixed)
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_bench_fill_measures_whole_lives_of_the_user_code() -> None:
    cpu = str(own_core())
    done = launched.run(  # forked from the tests' launcher: so is its own (pipefill/local/forker.py)
        [sys.executable, "-m", "pipefill", "bench", "fill", "--json", "--workload", "user-code", "--life", "--jobs", "2",
         "--total", "2000", "--bubbles-ms", "20", "--loads", "idle", "--cpu", cpu, "--timeout-s", "100",
         "--close-at", "0.5", "--trainer", "shares"],  # back early, after 50-100 % of each bubble; no waiting
        capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["mode"] == "life" and out["workload"] == {"name": "user-code"} and out["total"] == 2000
    assert out["close_at"] == 0.5 and out["trainer"] == "shares"
    (run,) = out["runs"]
    assert run["fill_exit_code"] == 0 and run["jobs_succeeded"] == ["life-0", "life-1"]  # both lives, to the end
    assert run["jobs_failed"] == {}, run["jobs_failed"]
    assert run["samples"] >= 4000  # every sample of both jobs (profiling steps are not counted as work)
    assert set(run["per_job"]) == {"life-0", "life-1"} and all(j["bubbles"] > 0 for j in run["per_job"].values())
    assert sum(j["bubbles"] for j in run["per_job"].values()) >= run["bubbles_used"]  # hand-offs count for both
    assert run["overrun_p50_ms"] <= run["overrun_p99_ms"] <= run["overrun_max_ms"]
    assert 0 <= run["trainer_wait_p99_ms"] <= run["trainer_wait_max_ms"]  # measured, not asserted (a benchmark)
    assert set(run["overrun_causes"]) <= set(OVERRUN_CAUSES)
    worst = run["worst_overruns"]  # the worst worked bubbles, worst first, the last one's step named
    assert 0 < len(worst) <= 8 and worst[0]["overrun_ms"] == run["overrun_max_ms"], worst
    assert all(w["last_ms"] > 0 and w["steps"] > 0 for w in worst), worst


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loads", "heavy"], "--loads 'heavy'"),
        (["--close-at", "1.5"], "--close-at 1.5: a fraction of the announced length, > 0 and <= 1"),
        (["--timeout-s", "0"], "--timeout-s 0.0: must be > 0 seconds"),
    ],
)
def test_bench_fill_refuses_bad_options_with_the_option_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        fill.main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_a_run_that_times_out_says_what_the_executor_did(tmp_path: Path) -> None:
    """The timeout's error (``BenchTimeout`` → ``stall_report``): the bubbles the executor took and worked in, why it
    stopped in the rest, each job's phase and committed units, the margins it planned with, its output's end."""
    (tmp_path / "fill").mkdir()
    events = EventWriter(tmp_path / "fill" / FILL_EVENTS)
    events.write(JobEvent(job="life-0", phase="Running", committed=0, total=64))
    for i in range(30):
        worked = i < 4
        events.write(
            FillEvent(
                id=i, kind="steady", open_ns=i, expected_end_ns=i + 10, woke_ns=i, yielded_ns=i + 9,
                job="life-0", steps=int(worked), items=int(worked), used_s=0.0, overrun_s=0.0,
                stop="time" if i % 3 else "memory", margin_s=0.0025 if i > 20 else 0.0,
            )
        )  # fmt: skip
    events.write(CommitEvent(job="life-0", end=4, bytes=16, commit_s=0.001))
    events.close()
    (tmp_path / "fill" / "output.log").write_text("WARNING job life-0: its last steps ran past the bubble\n")
    report = stall_report(tmp_path, last=20)
    assert "took 30 bubbles and ran steps in 4; of its last 20, 0 with steps" in report, report
    assert "{'time': 14, 'memory': 6}" in report and "learnt margins of [2.5] ms" in report, report
    assert "life-0 Running, 4 of 64 units committed" in report and report.endswith("ran past the bubble\n"), report
