"""The live view of ``pipefill local``: per rank its step, loss, tokens/s, bubble fraction and fill recovery, a progress
bar per fill job, and warnings (fill overruns, process restarts, job restarts) while the run goes on.

It reads only what the processes write anyway: the event logs, by byte offset at each tick (``pipefill.events.EventTail``),
summed with the report's own ``RankStats`` so that the live figures and ``report.json`` agree, and the fill jobs'
``<job>.status.json`` in the work directory (re-read when it changes). On a terminal it draws with ``rich``; into a
pipe or a file, or with ``--plain``, it prints plain lines instead: a status line every ``interval_s`` and each
warning as it happens.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from pipefill.events import EventTail, FillEvent
from pipefill.local.procs import LocalProcess
from pipefill.local.report import fill_job_status, rank_log_paths
from pipefill.local.runner import RunOutcome
from pipefill.local.stats import RankStats
from pipefill.spec import FillJob

__all__ = ["OVERRUN_WARN_S", "FillProgress", "LiveState", "PlainView", "RichView", "make_view"]

OVERRUN_WARN_S = 1e-3
"""A fill that yields more than this (seconds) after the trainer closed its bubble delayed training: worth a warning
(a fill record's ``trainer_wait_s``; past the bubble's *expected* end while the trainer was still idle, or suspended by
a trainer that took its core back, the fill delayed nothing, and the closing summary counts it as an overrun only)."""
_OVERRUN_WARN_EVERY_S = 5.0
"""Per rank, later waits are summed into one warning at most this often (seconds): on a busy CPU they are many."""
_STATUS_SUFFIX = ".status.json"


@dataclass
class FillProgress:
    """A fill job's progress as its status file says: committed units (samples, or steps) of ``total``."""

    name: str
    total: int | None
    committed: int = 0
    phase: str = "Queued"


@dataclass
class _Overruns:
    count: int = 0
    worst_s: float = 0.0
    warned_at: float = -math.inf  # time.monotonic() of the last warning
    causes: dict[str, int] = field(default_factory=dict)  # of those past the executor's guard


class LiveState:
    """What the files of a running job say so far; ``poll`` reads what they gained since the last call."""

    def __init__(
        self, *, world_size: int, out_dir: Path, work_dir: Path, fills: Sequence[FillJob], steps: int | None
    ) -> None:
        self.steps_total = steps
        """None: the job's own command decides (``spec.trainer``)"""
        self.ranks = [RankStats() for _ in range(world_size)]
        self.fill_jobs = {f.name: FillProgress(f.name, f.spec.total) for f in fills}
        self.procs: list[LocalProcess] = []
        self.outcome = RunOutcome(code=1, reason="not started")
        self._tails = [tuple(EventTail(p) for p in rank_log_paths(out_dir, r)) for r in range(world_size)]
        self._work_dir = work_dir
        self._status_mtime_ns: dict[str, int] = {}
        self._overruns = [_Overruns() for _ in range(world_size)]
        self._notes_seen = 0
        self._since_unix_s = time.time()  # overruns logged earlier (a previous run into the same --out) are history

    def poll(self, procs: list[LocalProcess], outcome: RunOutcome, *, final: bool = False) -> list[str]:
        """Take in the logs' new lines; returns the new messages (the runner's events, then overrun warnings)."""
        self.procs, self.outcome = procs, outcome
        messages = outcome.events[self._notes_seen :]
        self._notes_seen += len(messages)
        now = time.monotonic()
        for rank, (trainer, fill) in enumerate(self._tails):
            stats, overruns = self.ranks[rank], self._overruns[rank]
            for e in trainer.read(final=final):
                stats.add(e)
            for e in fill.read(final=final):
                stats.add(e)
                # the trainer waited for the fill: it closed the bubble and the fill yielded later, not preempted
                if isinstance(e, FillEvent) and e.trainer_wait_s > OVERRUN_WARN_S and e.wall_s >= self._since_unix_s:
                    overruns.count += 1
                    overruns.worst_s = max(overruns.worst_s, e.trainer_wait_s)
                    if e.overrun_cause:
                        overruns.causes[e.overrun_cause] = overruns.causes.get(e.overrun_cause, 0) + 1
            if final:
                stats.finish()
            if overruns.count and (final or now - overruns.warned_at >= _OVERRUN_WARN_EVERY_S):
                causes = ", ".join(f"{c} {n}" for c, n in sorted(overruns.causes.items(), key=lambda kv: -kv[1]))
                messages.append(
                    f"{time.strftime('%H:%M:%S')} warning: rank {rank}'s trainer waited for the fill after "
                    f"{overruns.count} bubble(s), worst {1e3 * overruns.worst_s:.1f} ms past the bubble's close"
                    + (f" (overran by {causes})" if causes else "")
                )
                overruns.count, overruns.worst_s, overruns.warned_at, overruns.causes = 0, 0.0, now, {}
        self._read_status()
        return messages

    def _read_status(self) -> None:
        for path in sorted(self._work_dir.glob(f"*{_STATUS_SUFFIX}")):
            name = path.name.removesuffix(_STATUS_SUFFIX)
            try:
                mtime_ns = path.stat().st_mtime_ns
            except OSError:
                continue
            if self._status_mtime_ns.get(name) == mtime_ns:
                continue
            known = self.fill_jobs.get(name)
            status = fill_job_status(self._work_dir, name, total=known.total if known is not None else None)
            if status is None:
                continue  # written atomically, so only a vanished file or a foreign one gets here
            self._status_mtime_ns[name] = mtime_ns
            row = self.fill_jobs.setdefault(name, FillProgress(name, status["total"]))
            row.committed, row.phase = status["committed"], status["phase"]

    def process_state(self, rank: int, container: str) -> str:
        """``running``, ``down`` (the runner restarts it) or ``exited N``, with its restarts."""
        proc = next((p for p in self.procs if p.rank == rank and p.container == container), None)
        if proc is None:
            return "—"
        code = proc.poll()
        state = (
            "running" if code is None else "down" if container == "fill-executor" and code != 0 else f"exited {code}"
        )
        restarts = self.outcome.process_restarts.get((rank, container), 0)
        return f"{state}, {restarts} restart(s)" if restarts else state


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _rank_cells(state: LiveState, rank: int) -> list[str]:
    """step, loss, tokens/s, bubble fraction, fill recovery."""
    stats = state.ranks[rank]
    summary = stats.summary()
    last = stats.last_step
    if last is None:
        return ["—", "—", "—", _pct(summary["bubble_fraction"]), _pct(summary["bubble_recovery"])]
    return [
        f"{last.step + 1}" if state.steps_total is None else f"{last.step + 1}/{state.steps_total}",
        "—" if math.isnan(last.loss) else f"{last.loss:.3f}",  # under the hook, ranks without the last stage
        f"{last.tokens_per_s:,.0f}" if last.tokens_per_s > 0 else "—",  # the hook does not know the batch
        _pct(summary["bubble_fraction"]),
        _pct(summary["bubble_recovery"]),
    ]


def _fill_text(row: FillProgress) -> str:
    return f"{row.committed}/{row.total if row.total is not None else '?'}"


class PlainView:
    """Plain lines for a pipe or a log file: each message as it comes, a status line every ``interval_s``."""

    def __init__(self, state: LiveState, *, out: IO[str] | None = None, interval_s: float = 5.0) -> None:
        self.state, self.interval_s = state, interval_s
        self._out = out if out is not None else sys.stdout
        self._last_status = time.monotonic()  # the first line after one interval: at start there is nothing to say

    def tick(self, procs: list[LocalProcess], outcome: RunOutcome) -> None:
        self._print(self.state.poll(procs, outcome))
        if time.monotonic() - self._last_status >= self.interval_s:
            self._print([self.status_line()])

    def close(self, outcome: RunOutcome) -> None:
        """After the run (finished, failed or interrupted): what is left to say, and where things are."""
        self._print([*self.state.poll(self.state.procs, outcome, final=True), self.status_line()])

    def status_line(self) -> str:
        self._last_status = time.monotonic()
        parts = [time.strftime("%H:%M:%S")]
        for rank in range(len(self.state.ranks)):
            if self.state.ranks[rank].last_step is None:
                parts.append(f"rank {rank}: no step yet")
                continue
            step, loss, tps, bubble, recovery = _rank_cells(self.state, rank)
            parts.append(f"rank {rank}: step {step}, loss {loss}, {tps} tokens/s, bubble {bubble}, recovery {recovery}")
        for row in self.state.fill_jobs.values():
            parts.append(f"fill {row.name} {_fill_text(row)} {row.phase}")
        return " | ".join(parts)

    def _print(self, lines: list[str]) -> None:
        for line in lines:
            print(line, file=self._out, flush=True)


class RichView:
    """A live table on a terminal; messages scroll above it."""

    def __init__(self, state: LiveState, *, console: Console | None = None) -> None:
        self.state = state
        self.console = console if console is not None else Console()
        # No refresh thread: the runner's ticks (5 a second) redraw, so Ctrl-C meets one thread only.
        self._live = Live(
            self.render(), console=self.console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False
        )
        self._live.start()

    def tick(self, procs: list[LocalProcess], outcome: RunOutcome) -> None:
        self._show(self.state.poll(procs, outcome))

    def close(self, outcome: RunOutcome) -> None:
        """Draw the last state and leave it on screen (where things are when the run ended)."""
        try:
            self._show(self.state.poll(self.state.procs, outcome, final=True))
        finally:
            self._live.stop()

    def _show(self, messages: list[str]) -> None:
        for line in messages:
            self._live.console.print(line, style="yellow", markup=False, highlight=False)
        self._live.update(self.render(), refresh=True)

    def render(self) -> RenderableType:
        state = self.state
        ranks = Table()
        for col in ("rank", "step", "loss", "tokens/s", "bubble", "recovery", "trainer", "fill executor"):
            ranks.add_column(col, justify="left" if col in ("trainer", "fill executor") else "right")
        for rank in range(len(state.ranks)):
            ranks.add_row(
                str(rank),
                *_rank_cells(state, rank),
                state.process_state(rank, "trainer"),
                state.process_state(rank, "fill-executor"),
            )
        if not state.fill_jobs:
            return ranks
        fills = Table(show_header=True, box=None)
        for col in ("fill job", "progress", "committed", "phase"):
            fills.add_column(col)
        for row in state.fill_jobs.values():
            bar = ProgressBar(total=float(row.total or 1), completed=float(row.committed), width=40)
            fills.add_row(row.name, bar, _fill_text(row), row.phase)
        return Group(ranks, fills)


def make_view(
    state: LiveState, *, plain: bool, interval_s: float = 5.0, out: IO[str] | None = None
) -> PlainView | RichView:
    """A rich view on a terminal, plain lines otherwise (``plain``, or ``out`` is not a TTY, or TERM=dumb)."""
    stream = out if out is not None else sys.stdout
    console = Console(file=stream)
    if plain or not stream.isatty() or console.is_dumb_terminal:
        return PlainView(state, out=stream, interval_s=interval_s)
    return RichView(state, console=console)
