"""The report of a local run, built from the event logs the trainers and fill executors write (:mod:`pipefill.events`).

``report.json`` (configuration, step times, bubbles per rank and kind, fill work, recovery), ``report.md``,
``trace.json`` (Chrome/Perfetto: one process per rank with tracks for the trainer's actions, the announced bubbles and
the fill work inside them) and ``timeline.png`` (the same, for the last steps; needs matplotlib).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from pathlib import Path
from typing import Any

import yaml

from pipefill.events import (
    FILL_EVENTS,
    TRAINER_EVENTS,
    ActionEvent,
    BubbleEvent,
    CommitEvent,
    Event,
    FillEvent,
    JobEvent,
    StepEvent,
    read_events,
)
from pipefill.local.idle import breakdown_markdown
from pipefill.local.stats import RankStats, merged, overrun_summary
from pipefill.spec import PipelineTrainingJob, to_obj
from pipefill.spec.loader import SAFE_LOADER

__all__ = [
    "FILL_WORK_DIR",
    "build_report",
    "fill_job_status",
    "overrun_causes",
    "plot_timeline",
    "prepare_plotting",
    "queue_rows",
    "rank_log_paths",
    "write_report",
]

FILL_WORK_DIR = "filljobs"
"""The fill queue of a local run, inside its output directory: FillJob manifests and their ``<job>.status.json``."""


def overrun_causes(summary: dict[str, Any]) -> str:
    """``3: step 2, commit 1`` (or ``0``): the bubbles overrun past the guard and their causes."""
    causes = ", ".join(f"{c} {n}" for c, n in summary["causes"].items())
    return f"{summary['past_guard']}: {causes}" if causes else "0"


def rank_log_paths(out_dir: Path, rank: int) -> tuple[Path, Path]:
    """The trainer's and the fill executor's event logs of ``rank``."""
    base = out_dir / "ranks" / str(rank)
    return base / "trainer" / TRAINER_EVENTS, base / "fill-executor" / FILL_EVENTS


def _logs(out_dir: Path, rank: int) -> tuple[list[Event], list[Event]]:
    trainer, fill = rank_log_paths(out_dir, rank)
    return read_events(trainer), read_events(fill)


def _fill_spans(fill: list[Event]) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of the fill's work inside each bubble it used."""
    return [(e.woke_ns, e.yielded_ns) for e in fill if isinstance(e, FillEvent) and e.steps]


def _rank_stats(trainer: list[Event], fill: list[Event]) -> dict[str, Any]:
    stats = RankStats()
    for e in merged(trainer, fill):
        stats.add(e)
    stats.finish()
    return stats.summary()


def fill_job_status(work_dir: Path, name: str, *, total: int | None = None) -> dict[str, Any] | None:
    """``{"committed", "total", "phase"}`` of fill job ``name`` from its status file (None when it has none yet).

    The status file is the job's merged state, written by whichever executor reported last (with slices, several
    executors report one job; their writes are merged), so it, not any one rank's events, says the phase. The total
    is ``total`` where the caller knows it (the live view, every few hundred milliseconds for every job whose status
    changed: parsing its manifest each time cost the runner 12 ms a job, a third of a core with 100 FillJobs),
    else it comes from the job's manifest beside it (None when that is gone).
    """
    try:
        status = json.loads((work_dir / f"{name}.status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if total is None:
        try:
            manifest = yaml.load((work_dir / f"{name}.yaml").read_text(encoding="utf-8"), Loader=SAFE_LOADER)
            total = int(manifest["spec"]["totalSamples"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            pass
    return {
        "committed": int(status.get("samplesDone") or 0),
        "total": total,
        "phase": str(status.get("phase") or "Queued"),
    }


def _manifests(work_dir: Path) -> dict[str, tuple[int | None, int]]:
    """Every FillJob of the run's queue (its manifests in ``work_dir``): name → (total, priority)."""
    found: dict[str, tuple[int | None, int]] = {}
    for path in sorted([*work_dir.glob("*.yaml"), *work_dir.glob("*.yml")]):
        try:
            docs = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER))
        except (OSError, yaml.YAMLError):
            continue
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != "FillJob":
                continue
            spec = doc.get("spec") or {}
            total = spec.get("totalSamples", spec.get("totalSteps"))
            name = (doc.get("metadata") or {}).get("name")
            if name:
                found[str(name)] = (int(total) if total is not None else None, int(spec.get("priority") or 0))
    return found


def queue_rows(work_dir: Path, rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rows`` (the jobs the executors' events name) and every other FillJob of the queue, with its phase and progress
    from its status file (Queued, 0 when it has none), as ``kubectl get filljobs`` lists them, in the queue's order
    (priority, then name). A job that never started says why it waits: its position among the waiting ones (the
    executors take the highest priority first, at most PIPEFILL_FILL_MAX_ACTIVE_JOBS per rank), or its status's
    message (a job no rank's bubbles fit)."""
    manifests = _manifests(work_dir)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(manifests) | set(rows), key=lambda n: (-manifests.get(n, (None, 0))[1], n)):
        total, priority = manifests.get(name, (None, 0))
        row = rows.get(name) or {"committed": 0, "total": total, "phase": "Queued", "started": False}
        row.setdefault("started", True)
        row["priority"] = priority
        status = fill_job_status(work_dir, name)
        if status is not None:
            row["committed"] = max(row["committed"], status["committed"])
            row["phase"] = status["phase"]
            row["total"] = status["total"] if status["total"] is not None else row["total"]
        if row["total"] is None:
            row["total"] = total
        out[name] = row
    waiting = [n for n, r in out.items() if not r["started"] and r["phase"] in ("Queued", "Pending")]
    for i, name in enumerate(waiting, 1):
        message = _status_message(work_dir, name)
        out[name]["waiting"] = message or (
            f"position {i} of {len(waiting)} waiting (priority {out[name]['priority']}); the executors take the "
            "highest priority first"
        )
    return out


def _status_message(work_dir: Path, name: str) -> str:
    try:
        status = json.loads((work_dir / f"{name}.status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return ""
    return str(status.get("message") or "")


def build_report(job: PipelineTrainingJob, out_dir: Path, *, outcome: dict[str, Any]) -> dict[str, Any]:
    """Everything ``report.json`` holds."""
    ranks = []
    fill_jobs: dict[str, dict[str, Any]] = {}
    bubbles: dict[str, list[FillEvent]] = {}
    for rank in range(job.world_size):
        trainer, fill = _logs(out_dir, rank)
        ranks.append({"rank": rank, **_rank_stats(trainer, fill)})
        for e in fill:
            if isinstance(e, FillEvent) and e.job is not None:
                bubbles.setdefault(e.job, []).append(e)
            if isinstance(e, CommitEvent):
                row = fill_jobs.setdefault(e.job, {"committed": 0, "total": None, "phase": "Running"})
                row["committed"] = max(row["committed"], e.end)
            elif isinstance(e, JobEvent):
                row = fill_jobs.setdefault(e.job, {"committed": 0, "total": None, "phase": "Running"})
                row["committed"] = max(row["committed"], e.committed or 0)
                row["total"] = e.total if e.total is not None else row["total"]
                row["phase"] = e.phase
    # events of several ranks interleave; the merged status says where a job is; jobs no executor started are listed
    fill_jobs = queue_rows(out_dir / FILL_WORK_DIR, fill_jobs)
    for name, row in fill_jobs.items():
        row["overruns"] = overrun_summary(bubbles.get(name, []))  # every rank's bubbles of the job
    trainer0, _ = _logs(out_dir, 0)
    steps = [e for e in trainer0 if isinstance(e, StepEvent)]
    later = [e.step_s for e in steps[len(steps) // 3 :]] or [e.step_s for e in steps]
    losses = _losses(out_dir, job.world_size)
    rates = [e.tokens_per_s for e in steps if e.tokens_per_s > 0]  # none under the hook: it does not know the batch
    idle = sum(r["idle_breakdown"][-1]["idle_s"] for r in ranks)
    offered = idle - sum(r["idle_breakdown"][-1]["seconds"].get("not_announced", 0.0) for r in ranks)
    work = sum(r["fill_step_s"] for r in ranks)
    fractions = [r["bubble_fraction"] for r in ranks if r["bubble_fraction"] is not None]
    return {
        "job": to_obj(job),
        "outcome": outcome,
        "emulation": "CPU: one core plays one GPU; a stage's trainer and fill executor share it",
        "steps": len(steps),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "step_s_median": statistics.median(later) if later else None,
        "tokens_per_s_median": statistics.median(rates) if rates else None,
        "bubble_fraction": statistics.fmean(fractions) if fractions else None,
        "bubble_recovery": work / idle if idle else None,
        "announced_recovery": work / offered if offered else None,
        "fill_step_s": work,
        "fill_busy_s": sum(r["fill_busy_s"] for r in ranks),
        "ranks": ranks,
        "fill_jobs": fill_jobs,
    }


def _losses(out_dir: Path, world_size: int) -> list[float]:
    """Every step's loss from the first rank that has one: rank 0 for our trainer (every rank learns it); under the
    hook the ranks holding the last stage (the others log NaN)."""
    for rank in range(world_size):
        trainer, _ = _logs(out_dir, rank)
        losses = [e.loss for e in trainer if isinstance(e, StepEvent)]
        if any(not math.isnan(x) for x in losses):
            return losses
    return []


def _spans(trainer: list[Event]) -> list[ActionEvent | BubbleEvent]:
    """The trainer's timed spans: actions and bubbles."""
    return [e for e in trainer if isinstance(e, ActionEvent | BubbleEvent)]


def _trace(job: PipelineTrainingJob, out_dir: Path) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    logs = [_logs(out_dir, r) for r in range(job.world_size)]
    starts = [e.start_ns for t, _ in logs for e in t if isinstance(e, ActionEvent | BubbleEvent | StepEvent)]
    t0 = min(starts, default=0)
    for rank, (trainer, fill) in enumerate(logs):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for tid, name in ((1, "trainer actions"), (2, "bubbles"), (3, "fill work")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        for e in _spans(trainer):
            tid, name = (1, e.action) if isinstance(e, ActionEvent) else (2, e.kind)
            events.append(
                {
                    "ph": "X",
                    "pid": rank,
                    "tid": tid,
                    "name": name,
                    "ts": (e.start_ns - t0) / 1e3,
                    "dur": (e.end_ns - e.start_ns) / 1e3,
                    "args": {"step": e.step},
                }
            )
        for s, end in _fill_spans(fill):
            events.append(
                {"ph": "X", "pid": rank, "tid": 3, "name": "fill", "ts": (s - t0) / 1e3, "dur": (end - s) / 1e3}
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _plot(job: PipelineTrainingJob, out_dir: Path, path: Path, *, last_steps: int = 2) -> bool:
    return plot_timeline(out_dir, list(range(job.world_size)), path, title=job.name, last_steps=last_steps)


def _import_pyplot() -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        return False
    return True


def prepare_plotting() -> None:
    """Import matplotlib in a thread while the run goes on: the import took 1.1 of the 2 s the timeline cost at the
    end of every ``pipefill local`` run (docs/benchmarks.md). :func:`plot_timeline` then finds it imported, or waits
    on the import lock for the rest."""
    threading.Thread(target=_import_pyplot, name="import-matplotlib", daemon=True).start()


def plot_timeline(out_dir: Path, ranks: list[int], path: Path, *, title: str, last_steps: int = 2) -> bool:
    """Draw the last steps of ``ranks`` (a run's event logs under ``out_dir``; a replay has only its replayed ranks)
    to ``path``: actions, bubbles, fill work. False when matplotlib or the steps are missing."""
    if not _import_pyplot():
        return False
    import matplotlib.pyplot as plt

    logs = [(_spans(trainer), fill) for trainer, fill in (_logs(out_dir, r) for r in ranks)]
    rows = len(ranks)
    final = max((e.step for t, _ in logs for e in t if isinstance(e, ActionEvent)), default=-1)
    keep = set(range(final - last_steps + 1, final + 1))
    # A restarted job appends to the same logs: take the newest occurrence of the kept steps (the clock only grows).
    firsts = [e.start_ns for t, _ in logs for e in t if isinstance(e, ActionEvent) and e.step == min(keep)]
    begin = max(firsts, default=0) - 1
    spans = [e for t, _ in logs for e in t if e.step in keep and e.start_ns >= begin - 10**9]
    if not spans:
        return False
    t0 = min(e.start_ns for e in spans)
    t1 = max(e.end_ns for e in spans)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.8 * rows))
    colors = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#8172b3"}
    for row, (trainer, fill) in enumerate(logs):
        y = rows - 1 - row
        for e in trainer:
            if e.step not in keep or e.start_ns < t0:
                continue
            x, w = (e.start_ns - t0) / 1e6, (e.end_ns - e.start_ns) / 1e6
            if isinstance(e, ActionEvent):
                kind = next((c for c in e.action if c in colors), "F")
                ax.broken_barh([(x, w)], (y + 0.1, 0.8), facecolors=colors[kind])
            else:
                ax.broken_barh([(x, w)], (y + 0.1, 0.8), facecolors="none", edgecolors="grey", hatch="//")
        for s, end in _fill_spans(fill):
            if t0 <= s <= t1:
                ax.broken_barh([((s - t0) / 1e6, (end - s) / 1e6)], (y + 0.35, 0.3), facecolors="#55a868")
    ax.set_yticks([rows - 1 - r + 0.5 for r in range(rows)], [f"rank {r}" for r in ranks])
    ax.set_xlabel("ms (last steps)")
    ax.set_title(f"{title}: actions (F blue, B orange), bubbles hatched, fill work green")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _markdown(report: dict[str, Any], files: dict[str, str]) -> str:
    """report.json in words, each figure rounded to what it means on this kind of run."""

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f}%"

    def num(v: float | None, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    step_ms = None if report["step_s_median"] is None else 1e3 * report["step_s_median"]
    lines = [
        f"# Local run of {report['job']['metadata']['name']}",
        "",
        f"- outcome: {report['outcome']['reason']} (exit {report['outcome']['code']})",
        f"- {report['emulation']}",
        f"- steps: {report['steps']}; loss {num(report['loss_first'], '.3f')} → {num(report['loss_last'], '.3f')}",
        f"- step time (median, later steps): {num(step_ms, '.1f')} ms; tokens/s: {num(report['tokens_per_s_median'], ',.0f')}",
        f"- bubble fraction: {pct(report['bubble_fraction'])}; bubble recovery (fill step time ÷ all idle time): "
        f"{pct(report['bubble_recovery'])} (÷ announced idle time: {pct(report['announced_recovery'])})",
        "",
        "| rank | bubble fraction | idle s | announced s | fill steps s | recovery | ÷ announced |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["ranks"]:
        lines.append(
            f"| {r['rank']} | {pct(r['bubble_fraction'])} | {r['bubble_s']:.3f} | {r['announced_bubble_s']:.3f} | "
            f"{r['fill_step_s']:.3f} | {pct(r['bubble_recovery'])} | {pct(r['announced_recovery'])} |"
        )
    lines += ["", "Where the idle time goes (share of each rank's measured idle time, by bubble kind):", ""]
    lines += breakdown_markdown([(r["rank"], r["idle_breakdown"]) for r in report["ranks"]])
    lines += [
        "",
        "Overruns: how long after a worked bubble's expected end the fill yielded; past the guard, by cause. The "
        "trainer's wait: how long after closing a bubble it waited for the fill's last work on the device.",
        "",
    ]
    lines += [
        "| fill job | committed | total | phase | bubbles worked | overrun p50 ms | p99 ms | max ms | past the guard "
        "| trainer's wait max ms |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, row in report["fill_jobs"].items():
        o = row.get("overruns") or overrun_summary([])
        phase = f"{row['phase']}: {row['waiting']}" if row.get("waiting") else row["phase"]
        lines.append(
            f"| {name} | {row['committed']} | {row['total']} | {phase} | {o['bubbles']} | "
            f"{o['overrun_p50_ms']:.3f} | {o['overrun_p99_ms']:.3f} | {o['overrun_max_ms']:.3f} | {overrun_causes(o)} "
            f"| {o['trainer_wait_max_ms']:.3f} |"
        )
    lines += ["", *(f"- {k}: `{v}`" for k, v in files.items())]
    return "\n".join(lines) + "\n"


def write_report(
    job: PipelineTrainingJob, out_dir: Path, *, outcome: dict[str, Any], timeline: bool = True
) -> dict[str, str]:
    """Write every report file into ``out_dir`` (``timeline``: timeline.png too, where matplotlib is installed);
    returns name -> path of what was written."""
    report = build_report(job, out_dir, outcome=outcome)
    files = {
        "report.json": str(out_dir / "report.json"),
        "report.md": str(out_dir / "report.md"),
        "trace": str(out_dir / "trace.json"),
    }
    (out_dir / "trace.json").write_text(json.dumps(_trace(job, out_dir)), encoding="utf-8")
    if timeline and _plot(job, out_dir, out_dir / "timeline.png"):
        files["timeline"] = str(out_dir / "timeline.png")
    (out_dir / "report.json").write_text(
        json.dumps({**report, "files": files}, indent=2, default=str), encoding="utf-8"
    )
    (out_dir / "report.md").write_text(_markdown(report, files), encoding="utf-8")
    return files
