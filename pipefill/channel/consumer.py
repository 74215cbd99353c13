"""The fill executor's side of the bubble channel: wait for a bubble, work while it is open, answer.

Waiting sleeps on a futex (the low half of ``bubble_seq``) after publishing ``fill_waiting = 1``, so the trainer
pays a FUTEX_WAKE only when someone sleeps. The sleep is cut into slices of ``SLICE_S``: between slices the
consumer checks that the trainer lives (its lock is held) and whether a restarted trainer replaced the file, in
which case it re-attaches by itself.

Optionally (:meth:`Consumer.set_spin`, off by default, and only for a fill on a core of its own) the consumer spins
on ``bubble_seq`` in a short window around the next bubble's predicted open (:class:`NextOpen`: the fill's own model
of the step's repeating gaps) instead of sleeping through the futex wake-up; before and after the window it sleeps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

from pipefill.channel import layout as L
from pipefill.channel._files import CHANNEL_FILE, FILL_LOCK, HOLD_FILE, TRAINER_LOCK, OwnerLock, resolve_dir
from pipefill.channel._mapping import Mapping
from pipefill.channel.errors import ChannelNotFoundError
from pipefill.channel.futex import Futex
from pipefill.channel.model import Bubble, BubbleKind, BubbleRecord, ChannelInfo
from pipefill.channel.nextopen import Anticipation

__all__ = ["Consumer"]

SLICE_S = 0.05
"""Longest futex sleep between liveness checks: bounds death detection and the (theoretical) lost wake-up."""
_SLICE_NS = int(SLICE_S * 1e9)
POLL_S = 0.02
"""Poll period while no live trainer owns the channel (waiting for the directory, the file or a restart)."""


class Consumer:
    """Attached to one channel directory as its fill executor. Use :meth:`attach`. Not thread-safe: it may move to
    a new mapping (after a trainer restart) inside any call, so use it from one thread."""

    def __init__(self, *, directory: Path, fill_lock: OwnerLock, trainer_lock: OwnerLock, mapping: Mapping) -> None:
        self._dir = directory
        self._hold_path = str(directory / HOLD_FILE)
        self._fill_lock = fill_lock
        self._trainer_lock = trainer_lock
        self._totals = [0, 0, 0, 0]  # acked, used_ns, overrun_ns, work since attach
        self._current: Bubble | None = None
        self._last_id = 0
        self.anticipation = Anticipation(self.close_of)
        """the next bubble's predicted open, the spin window around it and the spin's counters"""
        self._use(mapping)

    @classmethod
    def attach(cls, *, channel_dir: str | os.PathLike[str] | None = None, timeout_s: float = 30.0) -> Consumer:
        """Attach to the channel in ``channel_dir`` (default ``$PIPEFILL_CHANNEL_DIR`` or ``/run/pipefill``),
        waiting up to ``timeout_s`` for the directory, the file and a live trainer owning it.

        Raises ChannelNotFoundError when they do not appear in time, ChannelLayoutError / ChannelVersionError for a
        file that is not a channel of this layout version, ChannelBusyError when another fill executor is attached."""
        directory = resolve_dir(channel_dir)
        deadline = time.monotonic() + timeout_s
        while not directory.is_dir():
            if time.monotonic() >= deadline:
                raise ChannelNotFoundError(
                    f"channel directory {directory} does not exist after waiting {timeout_s:g} s: mount the shared "
                    "memory-backed emptyDir there in both containers, or set PIPEFILL_CHANNEL_DIR to it"
                )
            time.sleep(POLL_S)
        fill_lock = OwnerLock(directory / FILL_LOCK, create=True)
        trainer_lock: OwnerLock | None = None
        mapping: Mapping | None = None
        try:
            fill_lock.acquire(who="fill executor", holder="another process of this pod")
            why = ""
            while mapping is None:
                if trainer_lock is None and (directory / TRAINER_LOCK).exists():
                    trainer_lock = OwnerLock(directory / TRAINER_LOCK, create=False)
                if trainer_lock is not None:
                    mapping, why = _open_live(directory, trainer_lock)
                else:
                    why = "no trainer has created the channel yet"
                if mapping is None:
                    if time.monotonic() >= deadline:
                        raise ChannelNotFoundError(
                            f"no live trainer's channel in {directory} after {timeout_s:g} s: {why}"
                        )
                    time.sleep(POLL_S)
        except BaseException:
            fill_lock.close()
            if trainer_lock is not None:
                trainer_lock.close()
            raise
        if trainer_lock is None:  # pragma: no cover - a mapping implies the lock file
            raise ChannelNotFoundError(f"{directory / TRAINER_LOCK} vanished")
        return cls(directory=directory, fill_lock=fill_lock, trainer_lock=trainer_lock, mapping=mapping)

    def wait_bubble(self, timeout_s: float) -> Bubble | None:
        """The next bubble the trainer opens (or one open now that this consumer has not returned yet), or None
        after ``timeout_s``. Returns None early when the trainer dies during the call; while no live trainer owns
        the channel it waits for a restarted one and re-attaches. Sleeps in the kernel; spins only inside the window
        :meth:`set_spin` allows."""
        deadline = time.monotonic_ns() + int(timeout_s * 1e9)
        alive = was_alive = self._refresh()
        while True:
            if alive:
                b, seen = self._take()
                if b is not None:
                    return b
                now = time.monotonic_ns()
                left_ns = deadline - now
                if left_ns <= 0:
                    return None
                window = self.anticipation.window(self._current)
                if window is not None and now >= window[0]:
                    b = self._spin(seen, min(window[1], deadline))
                    if b is not None:
                        return b
                    continue
                sleep_ns = min(left_ns, _SLICE_NS, window[0] - now if window is not None else left_ns)
                m = self._m
                m.d[L.I_FILL_WAITING] = 1
                if m.q[L.Q_BUBBLE_SEQ] == seen:  # else the trainer wrote since: look again
                    self._futex.wait(seen, sleep_ns / 1e9)
                # A wake-up is nearly always a bubble: take it first. fill_waiting stays 1 until acknowledge() or
                # the next sleep; meanwhile an open_bubble costs the trainer one futex wake with no waiter.
                b, _ = self._take()
                if b is not None:
                    return b
                m.d[L.I_FILL_WAITING] = 0
            else:
                left_ns = deadline - time.monotonic_ns()
                if left_ns <= 0:
                    return None
                time.sleep(min(left_ns / 1e9, POLL_S))
            alive = self._refresh()
            if was_alive and not alive:
                return None
            was_alive = was_alive or alive

    def set_spin(self, window_s: float) -> None:
        """Spin (poll ``bubble_seq`` on this core) for ``window_s`` around each predicted bubble open instead of
        sleeping; 0 turns it off (the default). Only for a fill on a core the trainer does not use: there it costs
        the trainer nothing and saves the futex wake-up (and the trainer's FUTEX_WAKE: ``fill_waiting`` is 0 while
        spinning). On the trainer's own core it would take the core from the trainer right before its bubble."""
        if not window_s >= 0:
            raise ValueError(f"set_spin(window_s={window_s!r}): the window must be ≥ 0 seconds (0: off)")
        self.anticipation.window_ns = int(window_s * 1e9)

    def predicted_open_ns(self) -> int:
        """When the next bubble should open (CLOCK_MONOTONIC ns; 0: unknown yet), from the gaps between bubbles
        seen so far; call it between bubbles (:meth:`wait_bubble` does when spinning)."""
        return self.anticipation.predicted_open_ns(self._current)

    def is_open(self, bubble_id: int) -> bool:
        """Whether ``bubble_id`` (the bubble :meth:`wait_bubble` returned last) is still open: check it before every
        piece of work; once it is False, start nothing more. Reads shared memory only, plus one fcntl once the
        bubble is past its expected end (a trainer that died inside a bubble never closes it)."""
        cur = self._current
        if cur is None or cur.id != bubble_id:
            return False
        m = self._m
        snap = m.read_bubble()
        if snap is None or snap[1][0] != bubble_id or snap[1][1] != L.BUBBLE_OPEN:
            return False
        if m.channel_state() != L.STATE_READY:
            return False
        # Past its expected end a bubble may be open only because the trainer died inside it: ask the kernel.
        return time.monotonic_ns() <= cur.expected_end_ns or self._trainer_lock.held()

    def remaining_s(self) -> float:
        """Seconds until the expected end of the current bubble; 0.0 once it is closed, past its end, or none."""
        cur = self._current
        if cur is None or not self.is_open(cur.id):
            return 0.0
        return max(0.0, cur.remaining_s())

    def acknowledge(self, bubble_id: int, *, used_s: float, overrun_s: float = 0.0, work: int = 0) -> None:
        """The fill yielded ``bubble_id`` after ``used_s`` of device-busy time, ``overrun_s`` past the expected end,
        having done ``work`` units (samples, steps: the fill's choice). Feeds both sides' metrics."""
        if not (used_s >= 0.0 and overrun_s >= 0.0 and work >= 0):
            raise ValueError(
                f"acknowledge({bubble_id}): used_s={used_s}, overrun_s={overrun_s}, work={work} must be ≥ 0"
            )
        used_ns, overrun_ns = int(used_s * 1e9), int(overrun_s * 1e9)
        t = self._totals
        t[0] += 1
        t[1] += used_ns
        t[2] += overrun_ns
        t[3] += work
        self._m.d[L.I_FILL_WAITING] = 0
        self._answer(bubble_id, state=L.FILL_YIELDED, now_ns=time.monotonic_ns(), done=(used_ns, overrun_ns, work))
        _, f_off = L.ring_offsets(self._m.ring_capacity, bubble_id)
        m = self._m
        m.q[f_off >> 3] = 0
        L.FILL_ENTRY.pack_into(m.mm, f_off + 8, used_ns, overrun_ns, work)
        m.q[f_off >> 3] = bubble_id

    def hold_requested(self) -> bool:
        """Whether someone asked the fill to idle (``fill.hold`` exists in the channel directory; one stat)."""
        return os.path.exists(self._hold_path)

    def trainer_alive(self) -> bool:
        """Whether a live trainer owns the channel; re-attaches first when a restarted trainer replaced it."""
        return self._refresh()

    def heartbeat(self) -> None:
        """Record that the fill is alive (waiting and acknowledging do this too)."""
        self._m.q[L.Q_FILL_HEARTBEAT] = time.monotonic_ns()

    def publish_floor(self, floor_s: float) -> None:
        """Tell the trainer the shortest bubble the fill can use now (0: no estimate); a trainer whose
        ``spec.fill.minBubbleMilliseconds`` is unset announces no shorter bubble (one aligned store)."""
        self._m.q[L.Q_FILL_FLOOR] = max(0, int(floor_s * 1e9))

    def history(self) -> list[BubbleRecord]:
        return self._m.history()

    def info(self) -> ChannelInfo:
        return self._m.info()

    @property
    def generation(self) -> int:
        """The trainer initialization this consumer is attached to; grows when it re-attaches after a restart."""
        return self._gen

    def close(self) -> None:
        if self._m.fd < 0:
            return
        self._m.d[L.I_FILL_WAITING] = 0
        self._m.close()
        self._fill_lock.close()
        self._trainer_lock.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------------------------
    def _spin(self, seen: int, end_ns: int) -> Bubble | None:
        """Poll ``bubble_seq`` until it changes or ``end_ns``; the bubble if one opened. The trainer is not asked to
        wake anyone meanwhile (``fill_waiting`` 0)."""
        m, clock = self._m, time.monotonic_ns
        q, ix = m.q, L.Q_BUBBLE_SEQ
        m.d[L.I_FILL_WAITING] = 0
        t0 = now = clock()
        while q[ix] == seen and now < end_ns:
            now = clock()
        cur = self._current
        b, _ = self._take()
        self.anticipation.spun(cur, caught=b is not None, spin_ns=now - t0, over=now >= end_ns)
        return b

    def close_of(self, b: Bubble) -> int:
        """When bubble ``b`` (one this consumer returned) closed (CLOCK_MONOTONIC ns), from the header or its ring entry; 0 while it is open."""
        m = self._m
        snap = m.read_bubble()
        if snap is not None and snap[1][0] == b.id:
            return int(snap[1][9]) if snap[1][1] == L.BUBBLE_CLOSED else 0
        p_off, _ = L.ring_offsets(m.ring_capacity, b.id)
        if m.u64(p_off) != b.id:
            return 0
        actual_ns = L.PRODUCER_ENTRY.unpack_from(m.mm, p_off + 8)[5]
        return b.open_ns + actual_ns if m.u64(p_off) == b.id and actual_ns else 0

    def _use(self, mapping: Mapping) -> None:
        self._m = mapping
        self._gen = mapping.generation()
        self._futex = Futex(mapping.base + L.OFF_BUBBLE_SEQ)
        self._last_id = 0
        self._current = None
        seq = mapping.u64(L.OFF_ANSWER_SEQ)
        self._answer_seq = seq + (seq & 1)  # a fill that died mid-write left it odd
        mapping.d[L.I_FILL_PID] = os.getpid()
        mapping.d[L.I_FILL_WAITING] = 0
        mapping.q[L.Q_FILL_FLOOR] = 0  # a fill that left said what its own work needed, not this one's
        self._answer(0, state=L.FILL_IDLE, now_ns=time.monotonic_ns())

    def _take(self) -> tuple[Bubble | None, int]:
        """A bubble that is open and newer than the last one returned, if any, and the seq that was read.
        This is the path right after a wake-up, with cold caches: keep it short."""
        m = self._m
        q = m.q
        seq = q[L.Q_BUBBLE_SEQ]
        fields = L.BUBBLE_DATA.unpack_from(m.mm, L.OFF_BUBBLE_DATA)
        if seq & 1 or q[L.Q_BUBBLE_SEQ] != seq:  # a write in progress: the slow path
            snap = m.read_bubble()
            if snap is None:
                return None, m.u64(L.OFF_BUBBLE_SEQ)
            seq, fields = snap
        bid, state, kind, open_ns, end_ns, free_bytes, step, mb_idx, _, _ = fields
        if state != L.BUBBLE_OPEN or bid <= self._last_id or m.d[L.I_CHANNEL_STATE] != L.STATE_READY:
            return None, seq
        self._last_id = bid
        b = Bubble(bid, BubbleKind.from_code(kind), open_ns, end_ns, free_bytes, step, mb_idx, self._gen)
        self.anticipation.taken(bid)
        self._current = b
        self._answer(bid, state=L.FILL_RUNNING, now_ns=0)
        return b, seq

    def _answer(self, bubble_id: int, *, state: int, now_ns: int, done: tuple[int, int, int] = (0, 0, 0)) -> None:
        m, seq, t = self._m, self._answer_seq, self._totals
        q = m.q
        q[L.Q_ANSWER_SEQ] = seq + 1
        yielded = now_ns if state == L.FILL_YIELDED else 0
        L.ANSWER_DATA.pack_into(m.mm, L.OFF_ANSWER_DATA, bubble_id, state, 0, yielded, *done, *t)
        q[L.Q_ANSWER_SEQ] = seq + 2
        self._answer_seq = seq + 2
        if now_ns:
            q[L.Q_FILL_HEARTBEAT] = now_ns

    def _refresh(self) -> bool:
        """Liveness of the trainer owning our file; moves to a replacement file when there is one."""
        m = self._m
        state = m.channel_state()
        try:
            replaced = state == L.STATE_SUPERSEDED or os.stat(self._dir / CHANNEL_FILE).st_ino != m.ino
        except FileNotFoundError:
            replaced = False
        if replaced:
            new, _ = _open_live(self._dir, self._trainer_lock)
            if new is None:
                return False
            m.close()
            self._use(new)
            return True
        self.heartbeat()
        return state == L.STATE_READY and self._trainer_lock.held()


def _open_live(directory: Path, trainer_lock: OwnerLock) -> tuple[Mapping | None, str]:
    """The channel file if a live trainer owns it and it is ready, else (None, why)."""
    path = directory / CHANNEL_FILE
    try:
        m = Mapping.open_existing(path)
    except FileNotFoundError:
        return None, f"{path} does not exist (the trainer creates it)"
    if m.channel_state() == L.STATE_READY and trainer_lock.held():
        return m, ""
    state = m.channel_state()
    m.close()
    if state == L.STATE_FINISHED:
        return None, f"{path}: the trainer finished (channel_state finished)"
    return None, f"{path}: its trainer is not running (trainer.lock is free, channel_state {state})"
