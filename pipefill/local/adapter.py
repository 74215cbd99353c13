"""The local adapter of the decision core: a rank's processes seen as its pod, a decision applied to processes.

``pipefill local`` decides as the operator does, with :func:`pipefill.lifecycle.decide`; this module is all that
differs. The trainer and fill executor of one rank in one generation are that generation's pod ``<job>-<rank>``:
Running while the trainer runs, Succeeded or Failed once it ended, with the trainer's exit code in the kubelet's form
and the end of its log as the termination message (a pod's ``FallbackToLogsOnError``). A fill executor that exited is
reported as a :class:`~pipefill.lifecycle.FillExit` (here nobody else restarts it). A decision is applied as the
operator and the kubelet apply it: the pods to delete are stopped (SIGTERM, SIGKILL after the grace period), the
ranks to create start as the decision's generation, and the fill executors it restarts start again.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from pipefill import env
from pipefill.events import ExitEvent, read_events
from pipefill.lifecycle import Decision, FillExit, PodView, Termination, exit_code
from pipefill.local.procs import LocalProcess, stop_all
from pipefill.local.report import rank_log_paths
from pipefill.pods import pod_name
from pipefill.spec import PipelineTrainingJob

__all__ = ["LocalGang", "pod_uid", "tail"]


def pod_uid(job: PipelineTrainingJob, generation: int, rank: int) -> str:
    """The uid of a rank's pod in one generation: what the queue's assignments name (the executor's
    ``PIPEFILL_POD_UID``, as the downward API gives it in a pod)."""
    return f"local-{job.name}-g{generation}-r{rank}"


def tail(path: Path, lines: int = 3) -> str:
    """The last ``lines`` lines of a process' output, joined by `` | `` (a termination message's worth)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) if text else "(no output)"


def _left_with_its_trainer(out_dir: Path, proc: LocalProcess) -> bool:
    """Whether an executor that exited 0 left because its trainer stopped announcing: its last ``exit`` record
    says "trainer gone" (read once, when its exit is first seen)."""
    if proc.poll() != 0:
        return False
    records = read_events(rank_log_paths(out_dir, proc.rank)[1])
    last = next((e for e in reversed(records) if isinstance(e, ExitEvent)), None)
    return last is not None and last.reason == "trainer gone"


class LocalGang:
    """The processes of the current generation, observed as pods and driven by decisions. ``spawn`` gives every
    container of every rank for a new generation (fill executors first), not started; ``restarts`` counts the
    restarts of each (rank, container) over the run, for the metrics and the live view."""

    def __init__(self, job: PipelineTrainingJob, *, out_dir: Path, spawn: Callable[[], list[LocalProcess]]) -> None:
        self.job, self.out_dir, self.spawn = job, out_dir, spawn
        self.procs: list[LocalProcess] = []
        self.generation: dict[int, int] = {}  # rank -> generation of its processes
        self.restarts: dict[tuple[int, str], int] = {}
        self._exits: dict[int, FillExit] = {}  # rank -> its executor's exit, until it starts again
        self._last_exit: dict[int, int] = {}  # rank -> how its executor last ended (before a restart)

    def _of(self, rank: int, container: str) -> LocalProcess | None:
        return next((p for p in self.procs if p.rank == rank and p.container == container), None)

    def views(self, now: datetime.datetime) -> list[PodView]:
        """Every rank of the current processes as its pod."""
        out = []
        for rank in sorted(self.generation):
            trainer, fill = self._of(rank, "trainer"), self._of(rank, "fill-executor")
            code = None if trainer is None else trainer.poll()
            ended = None
            if code is not None and trainer is not None:
                kubelet = exit_code(code)
                message = tail(trainer.out_dir / "output.log") if kubelet else ""
                ended = Termination(kubelet, "Error" if kubelet else "Completed", message)
            out.append(
                PodView(
                    name=pod_name(self.job, rank),
                    rank=rank,
                    generation=self.generation[rank],
                    phase="Running" if code is None else "Succeeded" if code == 0 else "Failed",
                    deleting=False,
                    trainer=ended,
                    trainer_running=code is None and trainer is not None,
                    fill_restarts=0 if fill is None else fill.restarts,
                    fill_last_exit=self._last_exit.get(rank),
                    fill_exit=None if fill is None else self._fill_exit(fill, now),
                )
            )
        return out

    def _fill_exit(self, fill: LocalProcess, now: datetime.datetime) -> FillExit | None:
        code = fill.poll()
        if code is None:
            return None
        if fill.rank not in self._exits:
            left = _left_with_its_trainer(self.out_dir, fill)
            self._exits[fill.rank] = FillExit(exit_code(code), now, left)
        return self._exits[fill.rank]

    def apply(self, decision: Decision) -> None:
        """Stop the pods the decision deletes, start its fill-executor restarts and the ranks it creates."""
        names = set(decision.delete_pods)
        gone = [p for p in self.procs if pod_name(self.job, p.rank) in names]
        if gone:
            stop_all(gone)
            ranks = {p.rank for p in gone}
            self.procs = [p for p in self.procs if p.rank not in ranks]
            for rank in ranks:
                self.generation.pop(rank, None)
                self._exits.pop(rank, None)
                self._last_exit.pop(rank, None)
        for rank in decision.restart_fill:
            fill = self._of(rank, "fill-executor")
            end = self._exits.pop(rank, None)
            if fill is None or end is None:
                continue
            self._last_exit[rank] = end.exit_code
            fill.close()
            fill.restarts += 1
            key = (rank, fill.container)
            self.restarts[key] = self.restarts.get(key, 0) + 1
            fill.start()
        if decision.create_ranks:
            fresh = [p for p in self.spawn() if p.rank in set(decision.create_ranks)]
            for proc in fresh:
                proc.env[env.POD_UID] = pod_uid(self.job, decision.status.generation, proc.rank)
                proc.start()
                self.generation[proc.rank] = decision.status.generation
            self.procs = sorted([*self.procs, *fresh], key=lambda p: (p.container != "fill-executor", p.rank))

    def stop(self) -> None:
        stop_all(self.procs)
