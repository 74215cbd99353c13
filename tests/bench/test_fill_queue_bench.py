"""``pipefill bench fill-queue`` (issue #30): its queues hold the same samples, its counting on event logs written
here by hand (numbers worked out below), and one small real run through ``pipefill local`` end to end. Benchmarks
are not tests: nothing here asserts on speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipefill.bench.fill_queue import _fill_jobs, analyze, summarize

MS = 1_000_000


@pytest.mark.parametrize("config", ["one", "twenty", "hundred"])
def test_every_queue_holds_the_same_samples_in_its_own_jobs(config: str) -> None:
    jobs = _fill_jobs(config, 256)
    assert sum(j["spec"]["totalSamples"] for j in jobs) == 12_800
    assert len(jobs) == {"one": 1, "twenty": 20, "hundred": 100}[config]
    assert len({j["metadata"]["name"] for j in jobs}) == len(jobs)
    assert len({j["spec"]["output"]["path"] for j in jobs}) == len(jobs)
    workloads = {json.dumps(j["spec"]["workload"], sort_keys=True) for j in jobs}
    assert len(workloads) == (2 if config == "hundred" else 1)  # repeated, and (for a hundred) distinct
    assert _fill_jobs("alone", 256) == []


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _fill(job: str, woke_ms: int, items: int, used_ms: int) -> dict[str, Any]:
    woke = woke_ms * MS
    return {"event": "fill", "job": job, "woke_ns": woke, "yielded_ns": woke + used_ms * MS, "items": items,
            "used_s": used_ms / 1e3, "spans_ns": [[woke + MS, woke + used_ms * MS]]}  # fmt: skip


def test_counts_up_to_the_last_productive_fill_profiles_and_switch_gaps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = {"fill_jobs": {"a": {"committed": 30, "phase": "Succeeded"}, "b": {"committed": 10, "phase": "Running"}},
              "step_s_median": 0.05, "bubble_recovery": 0.4}  # fmt: skip
    (out / "ranks").mkdir(parents=True)
    (out / "report.json").write_text(json.dumps(report))
    bubbles = [
        {"event": "bubble", "announced": True, "start_ns": s * MS, "end_ns": (s + 10) * MS} for s in (0, 100, 200)
    ]
    bubbles.append({"event": "bubble", "announced": False, "start_ns": 50 * MS, "end_ns": 60 * MS})  # not announced
    _write(out / "ranks" / "0" / "trainer" / "events.jsonl", bubbles)
    _write(
        out / "ranks" / "0" / "fill-executor" / "fill-events.jsonl",
        [
            {"event": "startup", "job": "a", "start_ns": 0},
            _fill("a", 1, 30, 5),
            {"event": "profile", "job": "a", "cached": False, "mono_ns": 2_000 * MS},  # 2 s after a's start-up
            {"event": "commit", "job": "a", "mono_ns": 20 * MS},
            {"event": "startup", "job": "b", "start_ns": 30 * MS},
            {"event": "profile", "job": "b", "cached": True, "mono_ns": 40 * MS},  # 10 ms after b's
            _fill("b", 101, 10, 4),  # b's first productive step: 102 ms, 82 ms after a's last commit
            {"event": "commit", "job": "b", "mono_ns": 110 * MS},
            {"event": "startup", "job": "b", "start_ns": 150 * MS},  # b's next slice: its profile 20 ms after that
            {"event": "profile", "job": "b", "cached": True, "mono_ns": 170 * MS},
            {
                "**": "nothing after b's last productive fill counts",
                "event": "fill",
                "job": "b",
                "woke_ns": 201 * MS,
                "yielded_ns": 205 * MS,
                "items": 0,
                "used_s": 0.004,
            },
        ],
    )
    m = analyze(out)
    # announced bubbles up to the last productive fill (ended 105 ms): those at 0 and 100 ms, 20 ms in all
    assert m["samples_per_bubble_s"] == pytest.approx(40 / 0.020)
    assert m["bubble_time_used"] == pytest.approx(0.009 / 0.020)
    assert m["samples_committed"] == 40 and m["jobs"] == 2 and m["jobs_succeeded"] == 1
    assert m["profile_s"]["measured"] == {"n": 1, "median": 2.0, "max": 2.0}
    assert m["profile_s"]["cached"] == {"n": 2, "median": 0.015, "max": 0.02}  # not 0.14 s from b's first start-up
    assert m["switch_gap_s"] == {"n": 1, "median": 0.082, "max": 0.082}


def test_the_summary_pairs_each_repetition_with_its_own_single_job_and_training_alone() -> None:
    def run(rate: float, step_s: float, gap: float | None = None) -> dict[str, Any]:
        return {"samples_per_bubble_s": rate, "step_s_median": step_s, "switch_gap_s": {"median": gap}}

    reps = [
        {"one": run(100, 0.10), "twenty": run(90, 0.10, 0.01), "alone": run(0, 0.08)},
        {"one": run(200, 0.12), "twenty": run(220, 0.12, 0.03), "alone": run(0, 0.10)},
    ]
    s = summarize(reps)
    assert s["twenty"]["ratio_to_one"] == {"median": 1.0, "low": 0.9, "high": 1.1}
    assert s["one"]["slowdown"] == {"median": 0.225, "low": 0.2, "high": 0.25}
    assert s["twenty"]["switch_gap_s_median"] == {"median": 0.02, "low": 0.01, "high": 0.03}
    assert "ratio_to_one" not in s["one"] and "slowdown" not in s["alone"]


@pytest.mark.busy  # a benchmark's runs: heavy, nothing timed is asserted (tests/sharing.py)
@pytest.mark.timeout(300)
def test_a_small_run_end_to_end(tmp_path: Path) -> None:
    # 60 steps: the executors start (attach, first poll, claim, first calls) in the time their trainers leave, ~2 s
    argv = ["--configs", "twenty,alone", "--reps", "1", "--steps", "60", "--unit", "8", "--keep", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "pipefill", "bench", "fill-queue", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    (rep,) = result["runs"]
    assert set(rep) == {"twenty", "alone"} and result["config"]["samples"] == 400
    assert rep["twenty"]["jobs"] == 20 and rep["alone"]["jobs"] == 0
    assert rep["twenty"]["samples_committed"] > 0 and rep["twenty"]["samples_per_bubble_s"] > 0
    assert set(result["summary"]) == {"twenty", "alone"} and "slowdown" in result["summary"]["twenty"]
    # every committed sample is in a finished job's outputs, each id once: the queue loses and repeats nothing
    statuses = [
        json.loads(p.read_text()) for p in (tmp_path / "rep0-twenty" / "runs" / "cpu-demo").rglob("*.status.json")
    ]
    done_jobs = [s for s in statuses if s.get("phase") == "Succeeded"]
    assert all(s["samplesDone"] == sum(sl["end"] - sl["start"] for sl in s["slices"]) for s in done_jobs), done_jobs
