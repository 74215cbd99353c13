"""``pipefill bench fill-queue``: does a queue of many small FillJobs fill as well as one job? (issue #30)

One training configuration — examples/cpu-demo.yaml, 2 stages, 1F1B, run by ``pipefill local`` for ``--steps``
steps — filled with the same total samples of batch inference given four ways:

* ``one``: one FillJob of all the samples (the encoder builtin, as examples/fill-inference.yaml);
* ``twenty``: 20 FillJobs of that one workload, sizes 1–4 × ``unit``, priorities 0–4 (one profile, shared);
* ``hundred``: 100 FillJobs of mixed sizes (½–1½ × the mean) over two workloads, the encoder with two sets of
  parameters of about the same cost (two profiles, each shared by 50 jobs);
* ``alone``: no fill at all (``spec.fill.enabled: false``), for the slowdown.

The configurations run one after the other in each repetition, the order rotated from one repetition to the next, so
a drift of the machine's speed hits them alike. From each run's event logs, counted up to each rank's last productive
fill (a queue that runs out early is not charged for the bubbles after it):

* ``samples_per_bubble_s``: samples filled ÷ announced bubble seconds, and its ratio to ``one`` of the same
  repetition;
* ``profile_s``: per job and rank, from its start-up to its profile (each later slice's from its own start-up),
  split by whether the profile came from the cache;
* ``switch_gap_s``: on each rank, from one job's last commit to the next job's first productive fill step;
* ``slowdown``: the training step's median ÷ ``alone``'s of the same repetition, minus 1.

The summary gives each configuration's median over the repetitions with the lowest and highest, and the targets of
#30 (reported, never asserted): twenty ≥ 0.9 and hundred ≥ 0.8 of one, the switch gap ≤ one training step, the
slowdown no worse than one's. Runs need the machine to themselves: measure on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from pipefill.bench.fill_jobs import REPO
from pipefill.bench.machine import describe_machine
from pipefill.bench.runs import in_root, run_logged

__all__ = ["CONFIGS", "TARGETS", "analyze", "main"]

CONFIGS = ("one", "twenty", "hundred", "alone")
TARGETS = {"twenty_ratio_min": 0.9, "hundred_ratio_min": 0.8}
_TRAINING = REPO / "examples" / "cpu-demo.yaml"
_FILL = REPO / "examples" / "fill-inference.yaml"
_JOB = "cpu-demo"


def _fill_jobs(config: str, unit: int) -> list[dict[str, Any]]:
    """The FillJobs of ``config``: 20 × ``unit`` × 2.5 samples in all (``unit`` 256: 12 800, the issue's queue)."""
    base = yaml.safe_load(_FILL.read_text(encoding="utf-8"))
    total = 50 * unit
    params: list[dict[str, int] | None]
    if config == "one":
        sizes, params = [total], [None]
    elif config == "twenty":
        sizes, params = [unit * (i % 4 + 1) for i in range(20)], [None] * 20
    elif config == "hundred":
        mean = total // 100
        sizes = [max(1, mean * (2 + i % 5) // 4) for i in range(100)]  # ½, ¾, 1, 1¼, 1½ × the mean
        sizes[-1] += total - sum(sizes)
        params = [None if i % 2 else {"heads": 2} for i in range(100)]  # a second workload of about the same cost
    else:
        return []
    jobs = []
    for i, (size, extra) in enumerate(zip(sizes, params, strict=True)):
        job = yaml.safe_load(yaml.safe_dump(base))
        name = f"fq-{i:03d}"
        job["metadata"]["name"] = name
        job["spec"].update(totalSamples=size, priority=i % 5, output={"path": f"runs/fill/{name}"})
        if extra:
            job["spec"]["workload"]["parameters"].update(extra)
        jobs.append(job)
    return jobs


def _run(config: str, steps: int, unit: int, directory: Path, timeout_s: float) -> dict[str, Any]:
    """One ``pipefill local`` run of ``config`` in ``directory``; its measurements (:func:`analyze`)."""
    directory.mkdir(parents=True)
    (directory / "examples").symlink_to(REPO / "examples")  # the manifests' relative paths (corpus, outputs)
    training = yaml.safe_load(_TRAINING.read_text(encoding="utf-8"))
    if config == "alone":
        training["spec"]["fill"]["enabled"] = False
    (directory / "training.yaml").write_text(yaml.safe_dump(training, sort_keys=False), encoding="utf-8")
    argv = [sys.executable, "-m", "pipefill", "local", "-f", "training.yaml"]
    fills = _fill_jobs(config, unit)
    if fills:
        (directory / "fills.yaml").write_text(yaml.safe_dump_all(fills, sort_keys=False), encoding="utf-8")
        argv += ["-f", "fills.yaml"]
    argv += ["--steps", str(steps), "--plain", "--no-timeline", "--metrics-port", "0", "--out", f"runs/{_JOB}"]
    what = f"pipefill local ({config}) in {directory}"
    run_logged(argv, cwd=directory, log=directory / "output.log", timeout_s=timeout_s, what=what)
    return analyze(directory / "runs" / _JOB)


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def analyze(out: Path) -> dict[str, Any]:
    """The measurements of one ``pipefill local`` output directory (see the module's docstring)."""
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    announced_s = used_s = 0.0
    items = 0
    profiles: dict[str, list[float]] = {"cached": [], "measured": []}
    gaps: list[float] = []
    for rank_dir in sorted((out / "ranks").iterdir()):
        trainer = _events(rank_dir / "trainer" / "events.jsonl")
        fill = _events(rank_dir / "fill-executor" / "fill-events.jsonl")
        fills = [e for e in fill if e["event"] == "fill"]
        productive = [e for e in fills if e.get("items")]
        if not productive:
            continue
        last = max(e["yielded_ns"] for e in productive)
        announced_s += sum(
            (e["end_ns"] - e["start_ns"]) / 1e9
            for e in trainer
            if e["event"] == "bubble" and e.get("announced") and e["start_ns"] <= last
        )
        used_s += sum(e["used_s"] for e in fills if e["woke_ns"] <= last)
        items += sum(e["items"] for e in fills if e["woke_ns"] <= last)
        started: dict[str, int] = {}  # job -> the start-up its next profile is counted from
        for e in fill:
            if e["event"] == "startup":
                started.setdefault(e["job"], e["start_ns"])  # a profile measured over several slices: the first's
            elif e["event"] == "profile" and e["job"] in started:  # a later slice's profile: from its own start-up
                profiles["cached" if e["cached"] else "measured"].append((e["mono_ns"] - started.pop(e["job"])) / 1e9)
        gaps += _switch_gaps(fill, productive)
    jobs = report.get("fill_jobs") or {}
    return {
        "samples_committed": sum(r["committed"] for r in jobs.values()),
        "jobs": len(jobs),
        "jobs_succeeded": sum(r["phase"] == "Succeeded" for r in jobs.values()),
        "samples_per_bubble_s": round(items / announced_s, 1) if announced_s else None,
        "bubble_time_used": round(used_s / announced_s, 3) if announced_s else None,
        "bubble_recovery": report.get("bubble_recovery"),
        "step_s_median": report["step_s_median"],
        "profile_s": {k: _stats(v) for k, v in profiles.items()},
        "switch_gap_s": _stats(gaps),
    }


def _switch_gaps(fill: list[dict[str, Any]], productive: list[dict[str, Any]]) -> list[float]:
    """On one rank: from each job's last commit to the first productive fill step of another job after it."""
    last_commit: dict[str, int] = {}
    for e in fill:
        if e["event"] == "commit":
            last_commit[e["job"]] = max(last_commit.get(e["job"], 0), e["mono_ns"])
    gaps = []
    for job, at in last_commit.items():
        later = [e for e in productive if e["job"] != job and e["yielded_ns"] > at]
        if later:
            first = min(e["spans_ns"][0][0] if e.get("spans_ns") else e["woke_ns"] for e in later)
            gaps.append(max(0.0, (first - at) / 1e9))
    return gaps


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "median": None, "max": None}
    return {"n": len(values), "median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "low": None, "high": None}
    return {"median": round(statistics.median(values), 3), "low": round(min(values), 3), "high": round(max(values), 3)}


def summarize(reps: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per configuration: medians with the lowest and highest over the repetitions, ratios within each."""
    out: dict[str, Any] = {}
    for config in {c for rep in reps for c in rep}:
        runs = [rep[config] for rep in reps if config in rep]
        row: dict[str, Any] = {
            "samples_per_bubble_s": _spread([r["samples_per_bubble_s"] for r in runs if r["samples_per_bubble_s"]]),
            "step_s_median": _spread([r["step_s_median"] for r in runs]),
        }
        ratios = [
            rep[config]["samples_per_bubble_s"] / rep["one"]["samples_per_bubble_s"]
            for rep in reps
            if config in rep
            and "one" in rep
            and rep[config]["samples_per_bubble_s"]
            and rep["one"]["samples_per_bubble_s"]
        ]
        if config not in ("one", "alone"):
            row["ratio_to_one"] = _spread(ratios)
        slowdowns = [
            rep[config]["step_s_median"] / rep["alone"]["step_s_median"] - 1
            for rep in reps
            if "alone" in rep and config in rep
        ]
        if config != "alone":
            row["slowdown"] = _spread(slowdowns)
            gaps = [g for r in runs if (g := r["switch_gap_s"]["median"]) is not None]
            row["switch_gap_s_median"] = _spread(gaps)
        out[config] = row
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pipefill bench fill-queue", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every configuration, interleaved (default 3)")
    p.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    p.add_argument("--unit", type=int, default=256, help="samples: 50 × this in all, per configuration (256)")
    p.add_argument("--timeout-s", type=float, default=900, help="a run taking longer is an error (default 900)")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep every run's directory under DIR (default: removed)")
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or not configs or args.reps < 1 or args.steps < 10 or args.unit < 4:
        p.error(f"--configs {args.configs!r} (of {', '.join(CONFIGS)}), --reps ≥ 1, --steps ≥ 10, --unit ≥ 4")
    load_before = [round(x, 2) for x in os.getloadavg()]

    def run_all(root: Path) -> list[dict[str, dict[str, Any]]]:
        reps = []
        for rep in range(args.reps):
            order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
            reps.append({c: _run(c, args.steps, args.unit, root / f"rep{rep}-{c}", args.timeout_s) for c in order})
        return reps

    reps = in_root("fill-queue", args.keep, run_all, error_json=True)
    if reps is None:
        return 1
    result = {
        "benchmark": "fill-queue",
        "config": {"steps": args.steps, "samples": 50 * args.unit, "reps": args.reps, "training": str(_TRAINING)},
        "machine": describe_machine(cores_used=None, gpus=[]),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "summary": summarize(reps),
        "targets": TARGETS,
        "runs": reps,
    }
    print(json.dumps(result))
    return 0
