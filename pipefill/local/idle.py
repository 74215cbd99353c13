"""Where a rank's idle time goes: every wait the trainer measured, accounted over its whole length.

A wait (the trainer's ``bubble`` record: from the moment the rank blocked to the moment it resumed) is matched with
the fill executor's ``fill`` record of the bubble announced inside it, and cut into consecutive pieces that add up to
its length exactly:

``not_announced``
    the trainer did not offer it (predicted below ``minBubbleMilliseconds``, or a wait it did not predict);
``held``, ``not_taken``
    announced, but the fill was told to idle (benchmark blocks A), or it never took the bubble (busy, starting);
``wake_up``
    from the rank blocking to the fill running (the announcement, the futex wake, the scheduler);
``switch_in``, ``between_steps``, ``yield``
    the fill's own bookkeeping: before its first step (planning), between steps, after its last (acknowledging);
``fill_steps``, ``fill_pieces``, ``fill_carried``, ``fill_continued``, ``profiling``, ``commit``
    the fill's work — whole steps; pieces of a batch (partial steps, issue #25); pieces of a batch an earlier bubble
    left in flight (the carry-over); pieces run past the planned end while the bubble was still open (the
    continuation) —, its profiling steps (they do no work), and its commits;
``tail_short``, ``guard``, ``beyond_prediction``
    idle after the fill yielded: before the fill's deadline (no step fitted the time left), between it and the
    trainer's expected end (the guard, and the margin the fill's end model kept), and past both (the wait lasted
    longer than the trainer predicted and than the fill planned for);
``skipped_<reason>``
    the fill took the bubble and ran nothing (``short``, ``idle``: no job, ``memory``, ``time``: not even the
    smallest step fitted, ``error``).

``overrun_past_close`` is not idle time: how long the fill ran after the rank resumed (what training waited for).
Recovery = the fill's work (:data:`WORK`) ÷ idle: announcing less or holding a bubble without working cannot raise
it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from pipefill.events import BubbleEvent, Event, FillEvent, HoldEvent, StartEvent

__all__ = ["CATEGORIES", "WORK", "IdleAccount", "breakdown_markdown", "breakdown_rows"]

WORK = ("fill_steps", "fill_pieces", "fill_carried", "fill_continued")
"""The pieces of the idle time the fill did work in (recovery is their sum ÷ idle)."""
CATEGORIES = (
    *WORK,
    "profiling",
    "commit",
    "wake_up",
    "switch_in",
    "between_steps",
    "yield",
    "tail_short",
    "guard",
    "beyond_prediction",
    "not_announced",
    "not_taken",
    "held",
)
"""The pieces every wait is cut into (plus ``skipped_<reason>``), in the order reports print them."""
_MAX_PENDING = 100_000  # waits kept for their fill record at most (a fill that never writes one: memory stays bounded)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


class IdleAccount:
    """One rank's idle time by bubble kind and piece, fed one record at a time (whole logs or a live tail; the
    trainer's and the fill's records may come in any interleaving). Waits are accounted once their fill record is
    known, or once the fill's log is past them (a fill that writes nothing, dead or not started, leaves them
    waiting; at most ``_MAX_PENDING``); :meth:`flush` accounts the rest."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.waits_by_kind: dict[str, int] = defaultdict(int)
        self.overrun_past_close_s = 0.0
        self.guard_ns = 0
        self._waits: deque[BubbleEvent] = deque()
        self._fills: deque[FillEvent] = deque()
        self._holds: list[tuple[int, bool]] = []
        self._fill_seen_ns = 0

    def add(self, e: Event) -> None:
        if isinstance(e, BubbleEvent):
            self._waits.append(e)
        elif isinstance(e, FillEvent):
            self._fills.append(e)
            self._fill_seen_ns = max(self._fill_seen_ns, e.open_ns)
        elif isinstance(e, HoldEvent):
            self._holds.append((e.mono_ns, e.held))
            self._fill_seen_ns = max(self._fill_seen_ns, e.mono_ns)
            return
        elif isinstance(e, StartEvent):
            self.guard_ns = int(e.guard_s * 1e9)
            return
        else:
            return
        self._resolve(final=False)

    def flush(self) -> None:
        """Account every wait still open to matching (the end of the logs)."""
        self._resolve(final=True)

    def idle_s(self, kind: str | None = None) -> float:
        rows = self.by_kind.values() if kind is None else [self.by_kind.get(kind, {})]
        return sum(sum(r.values()) for r in rows)

    def piece_s(self, piece: str) -> float:
        return sum(r.get(piece, 0.0) for r in self.by_kind.values())

    def _resolve(self, *, final: bool) -> None:
        waits, fills = self._waits, self._fills
        if len(waits) > 1 and waits[-1].start_ns < waits[-2].start_ns:  # logs read out of order: sort once
            self._waits = waits = deque(sorted(waits, key=lambda w: w.start_ns))
        if len(fills) > 1 and fills[-1].open_ns < fills[-2].open_ns:
            self._fills = fills = deque(sorted(fills, key=lambda f: f.open_ns))
        while waits:
            w = waits[0]
            while fills and fills[0].open_ns < w.start_ns:  # a bubble of no logged wait (before logging began)
                fills.popleft()
            if fills and fills[0].open_ns <= w.end_ns:
                self._account(waits.popleft(), fills.popleft())
            elif not w.announced or fills or final or self._fill_seen_ns > w.end_ns or len(waits) > _MAX_PENDING:
                self._account(waits.popleft(), None)
            else:
                break

    def _held_at(self, t_ns: int) -> bool:
        held = False
        for at, state in self._holds:
            if at > t_ns:
                break
            held = state
        return held

    def _account(self, w: BubbleEvent, f: FillEvent | None) -> None:
        row = self.by_kind[w.kind]
        self.waits_by_kind[w.kind] += 1
        start, end = w.start_ns, w.end_ns
        length = max(0, end - start)
        if not w.announced:
            row["not_announced"] += length / 1e9
            return
        if f is None:
            row["held" if self._held_at(start) else "not_taken"] += length / 1e9
            return
        woke = min(max(f.woke_ns, start), end)
        row["wake_up"] += (woke - start) / 1e9
        if not f.spans_ns and not f.commits_ns:
            row[f"skipped_{f.stop or 'time'}"] += (end - woke) / 1e9
            return
        spans = [(int(s), int(e), _span_kind(f, i)) for i, (s, e) in enumerate(f.spans_ns)]
        pieces = sorted(spans + [(int(s), int(e), "commit") for s, e in f.commits_ns])
        cursor, gap = woke, "switch_in"
        for s, e, what in pieces:
            s, e = min(max(s, cursor), end), min(max(e, cursor), end)
            row[gap] += (s - cursor) / 1e9
            row[what] += (e - s) / 1e9
            cursor, gap = e, "between_steps"
        done = min(max(f.yielded_ns, cursor), end)
        row["yield"] += (done - cursor) / 1e9
        expected = f.expected_end_ns
        deadline = expected - self.guard_ns if f.deadline_ns is None else f.deadline_ns
        row["tail_short"] += _overlap(done, end, done, deadline) / 1e9
        row["guard"] += _overlap(done, end, deadline, max(deadline, expected)) / 1e9
        row["beyond_prediction"] += _overlap(done, end, max(deadline, expected), end) / 1e9
        self.overrun_past_close_s += max(0, f.yielded_ns - end) / 1e9


_SPAN_KINDS = {"w": "fill_steps", "p": "fill_pieces", "c": "fill_carried", "x": "fill_continued", "m": "profiling"}


def _span_kind(f: FillEvent, i: int) -> str:
    """What span ``i`` of ``f`` was: the record's ``span_kinds`` letter; a record without them (older logs): a
    profiling step when the bubble had no work batch size or its batch size is 0, else a whole step."""
    if i < len(f.span_kinds):
        return _SPAN_KINDS.get(f.span_kinds[i], "fill_steps")
    sizes = f.batch_sizes
    return "profiling" if f.batch_size is None or (i < len(sizes) and not sizes[i]) else "fill_steps"


def breakdown_rows(account: IdleAccount) -> list[dict[str, Any]]:
    """One row per bubble kind and a total: waits, idle seconds, and each piece as seconds and share of the idle."""
    kinds = sorted(account.by_kind)
    pieces = [*CATEGORIES, *sorted({p for r in account.by_kind.values() for p in r if p not in CATEGORIES})]
    out = []
    for kind in [*kinds, None]:
        idle = account.idle_s(kind)
        rows = account.by_kind.values() if kind is None else [account.by_kind[kind]]
        seconds = {p: sum(r.get(p, 0.0) for r in rows) for p in pieces}
        out.append(
            {
                "kind": kind or "all",
                "waits": sum(account.waits_by_kind.values()) if kind is None else account.waits_by_kind[kind],
                "idle_s": idle,
                "seconds": {p: v for p, v in seconds.items() if v},
                "share": {p: v / idle for p, v in seconds.items() if v and idle},
            }
        )
    return out


def breakdown_markdown(ranks: list[tuple[int, list[dict[str, Any]]]]) -> list[str]:
    """A Markdown table of :func:`breakdown_rows` for several ranks: idle seconds, then each piece's share of it
    (0.1 % resolution: a share finer than that means nothing on a shared machine); pieces no rank has are left out."""
    pieces = [p for p in CATEGORIES if any(p in row["seconds"] for _, rows in ranks for row in rows)]
    pieces += sorted({p for _, rows in ranks for row in rows for p in row["seconds"] if p not in CATEGORIES})
    head = ["rank", "kind", "waits", "idle s", *(p.replace("_", " ") for p in pieces)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (1 + len(pieces))]
    for rank, rows in ranks:
        for row in rows:
            shares = [f"{100 * row['share'].get(p, 0.0):.1f}%" for p in pieces]
            kind = f"**{row['kind']}**" if row["kind"] == "all" else row["kind"]
            lines.append(
                "| " + " | ".join([str(rank), kind, str(row["waits"]), f"{row['idle_s']:.3f}", *shares]) + " |"
            )
    return lines
