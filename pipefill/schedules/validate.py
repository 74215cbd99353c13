"""Schedule validation: every action well-placed, done exactly once, and every dependency satisfiable.

Rules, checked in this order (the first broken one raises :class:`ScheduleError`):

1. each action names a stage that exists, held by the rank it is listed on, and a microbatch below ``m``;
2. each (stage, kind, microbatch) appears at most once;
3. each stage runs ``F`` for every microbatch, and either ``B`` or both ``I`` and ``W`` (never ``B`` and ``I``);
4. replaying the ranks in order, every action eventually runs. Dependencies: ``F`` of stage ``s`` needs ``F`` of
   ``s − 1``; ``B``/``I`` of ``s`` needs its own ``F`` and the input gradient from ``B``/``I`` of ``s + 1`` (the
   last stage only its own ``F``); ``W`` needs its ``I``. A deadlock is reported at the first action that can never
   run, with the dependency it waits for and where that dependency is stuck.

Point-to-point streams (:func:`p2p_streams`): the tensors one stage hands to its neighbour on another rank form one
*stream* per directed stage edge — ``s → s+1`` activations (sent after ``F`` of ``s``, consumed by ``F`` of ``s+1``),
``s+1 → s`` input gradients (sent after ``B``/``I`` of ``s+1``, consumed by ``B``/``I`` of ``s``). NCCL ignores tags
and matches a communicator's messages in posting order, so the trainer gives every stream its own communicator and
posts each stream's receives in its *send* order. Where the receiver consumes in another order (possible only in a
custom CSV; every built-in schedule agrees), it posts the earlier-sent receives ahead of use. That can neither
mismatch nor deadlock a schedule that passes rule 4: the message the receiver waits for was sent after the ones
posted before it, so they have arrived by then. No schedule is refused for its stream orders.

Positions in messages: ``rank r (row r+1)`` is the rank's row in the CSV / order table, ``action #i`` the 0-based index
into that rank's compute actions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipefill.schedules.model import Action, Kind, Schedule, ScheduleError

__all__ = ["Key", "P2PStream", "dependencies", "p2p_streams", "produces", "validate_schedule"]

# What an action makes available: (stage_idx, what, mb_idx) with what in F (activations), G (input gradient), I, W, B.
Key = tuple[int, str, int]


def produces(action: Action) -> tuple[Key, ...]:
    s, m = action.stage_idx, action.mb_idx
    if action.kind is Kind.F:
        return ((s, "F", m),)
    if action.kind is Kind.W:
        return ((s, "W", m),)
    return ((s, "G", m), (s, action.kind.value, m))


def dependencies(action: Action, num_stages: int) -> tuple[Key, ...]:
    """Keys that must be produced before ``action`` can start (own-rank and cross-rank alike)."""
    s, m = action.stage_idx, action.mb_idx
    if action.kind is Kind.F:
        return ((s - 1, "F", m),) if s > 0 else ()
    if action.kind is Kind.W:
        return ((s, "I", m),)
    own = (s, "F", m)
    return (own, (s + 1, "G", m)) if s < num_stages - 1 else (own,)


def _where(rank: int, idx: int, action: Action) -> str:
    return f"rank {rank} (row {rank + 1}), action #{idx} '{action}'"


def _describe(key: Key) -> str:
    s, what, m = key
    return {
        "F": f"the forward output of stage {s} for microbatch {m} ('{s}F{m}')",
        "G": f"the input gradient of stage {s} for microbatch {m} ('{s}B{m}' or '{s}I{m}')",
        "I": f"the input-gradient backward '{s}I{m}'",
    }[what]


def validate_schedule(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first broken rule (see the module docstring)."""
    n, m = schedule.num_stages, schedule.num_microbatches
    if schedule.num_ranks < 1 or n < 1 or m < 1:
        raise ScheduleError(f"schedule needs >= 1 rank, stage and microbatch, got {schedule.num_ranks}, {n}, {m}")
    seen: dict[Action, tuple[int, int]] = {}
    for rank, actions in enumerate(schedule.ranks):
        for idx, a in enumerate(actions):
            if not 0 <= a.stage_idx < n:
                raise ScheduleError(f"{_where(rank, idx, a)}: stage {a.stage_idx} does not exist (stages 0..{n - 1})")
            if schedule.placement[a.stage_idx] != rank:
                raise ScheduleError(
                    f"{_where(rank, idx, a)}: stage {a.stage_idx} is placed on rank "
                    f"{schedule.placement[a.stage_idx]}; a stage runs on exactly one rank"
                )
            if not 0 <= a.mb_idx < m:
                raise ScheduleError(f"{_where(rank, idx, a)}: microbatch {a.mb_idx} does not exist (0..{m - 1})")
            if a in seen:
                r0, i0 = seen[a]
                raise ScheduleError(f"{_where(rank, idx, a)} repeats {_where(r0, i0, a)}; each runs exactly once")
            seen[a] = (rank, idx)
    _check_complete(schedule, seen)
    _check_runnable(schedule)


def _check_complete(schedule: Schedule, seen: dict[Action, tuple[int, int]]) -> None:
    for s in range(schedule.num_stages):
        rank = schedule.placement[s]
        for mb in range(schedule.num_microbatches):
            has = {k for k in Kind if Action(s, k, mb) in seen}
            where = f"rank {rank} (row {rank + 1}), stage {s}, microbatch {mb}"
            if Kind.F not in has:
                raise ScheduleError(f"{where}: forward '{s}F{mb}' is missing; every stage runs every microbatch")
            if Kind.B in has and (Kind.I in has or Kind.W in has):
                raise ScheduleError(f"{where}: has both full backward '{s}B{mb}' and split backward I/W; use one")
            if Kind.B not in has and Kind.I not in has:
                raise ScheduleError(f"{where}: backward is missing; add '{s}B{mb}' or '{s}I{mb}' and '{s}W{mb}'")
            if (Kind.I in has) != (Kind.W in has):
                missing = "W" if Kind.I in has else "I"
                raise ScheduleError(f"{where}: '{s}{missing}{mb}' is missing; a split backward needs both I and W")


def _check_runnable(schedule: Schedule) -> None:
    n = schedule.num_stages
    done: set[Key] = set()
    heads = [0] * schedule.num_ranks
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule.ranks):
            i = heads[rank]
            while i < len(actions) and all(d in done for d in dependencies(actions[i], n)):
                done.update(produces(actions[i]))
                i += 1
            if i != heads[rank]:
                heads[rank] = i
                progress = True
    stuck = [r for r, acts in enumerate(schedule.ranks) if heads[r] < len(acts)]
    if not stuck:
        return
    position = {a: (r, i) for r, acts in enumerate(schedule.ranks) for i, a in enumerate(acts)}

    def producer(key: Key) -> Action:
        s, what, mb = key
        kinds = {"F": (Kind.F,), "I": (Kind.I,), "G": (Kind.B, Kind.I)}[what]
        return next(Action(s, k, mb) for k in kinds if Action(s, k, mb) in position)

    def explain(rank: int) -> tuple[bool, str]:
        head = schedule.ranks[rank][heads[rank]]
        key = next(d for d in dependencies(head, n) if d not in done)
        prod = producer(key)
        r2, i2 = position[prod]
        text = f"{_where(rank, heads[rank], head)} can never run: it needs {_describe(key)}, "
        if r2 == rank:
            return True, text + f"which comes later on the same rank (action #{i2}); move it before"
        blocker = schedule.ranks[r2][heads[r2]]
        return False, text + (
            f"produced by {_where(r2, i2, prod)}, which waits behind {_where(r2, heads[r2], blocker)} "
            "(a circular wait between the ranks); reorder one of them"
        )

    # Report an own-rank ordering mistake first (the clearest fix), else the lowest stuck rank.
    explained = [explain(r) for r in stuck]
    same_rank = [text for is_local, text in explained if is_local]
    ran = sum(heads)
    total = sum(len(a) for a in schedule.ranks)
    first = same_rank[0] if same_rank else explained[0][1]
    raise ScheduleError(f"deadlock after {ran} of {total} actions: {first}")


@dataclass(frozen=True, slots=True)
class P2PStream:
    """The tensors stage ``src_stage`` sends to its neighbour ``dst_stage`` on another rank, in one direction."""

    src_stage: int
    dst_stage: int
    src_rank: int
    dst_rank: int
    send_order: tuple[int, ...]
    """microbatch indices in the order the sender's actions produce them (the order NCCL delivers them)"""
    recv_order: tuple[int, ...]
    """microbatch indices in the order the receiver's actions consume them"""

    @property
    def is_grad(self) -> bool:
        """Input gradients flowing back (``dst_stage < src_stage``), else activations."""
        return self.dst_stage < self.src_stage

    @property
    def reordered(self) -> bool:
        """The receiver consumes in another order than the sender sends: its receives are posted in send order."""
        return self.send_order != self.recv_order

    def __str__(self) -> str:
        what = "input gradients" if self.is_grad else "activations"
        return f"stage {self.src_stage} -> {self.dst_stage} {what} (rank {self.src_rank} -> {self.dst_rank})"


def p2p_streams(schedule: Schedule) -> tuple[P2PStream, ...]:
    """Every cross-rank stream of ``schedule`` (see the module docstring), by stage edge, activations first.

    The order is canonical: every rank computes the same tuple, so it can create one communicator per stream in the
    same order everywhere. Same-rank edges (consecutive stages on one rank, the turn of a V) carry no stream.
    """
    place, last = schedule.placement, schedule.num_stages - 1
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for actions in schedule.ranks:
        for a in actions:
            s = a.stage_idx
            if a.kind is Kind.F:
                if s < last:
                    sends.setdefault((s, s + 1), []).append(a.mb_idx)
                if s > 0:
                    recvs.setdefault((s - 1, s), []).append(a.mb_idx)
            elif a.kind in (Kind.B, Kind.I):
                if s > 0:
                    sends.setdefault((s, s - 1), []).append(a.mb_idx)
                if s < last:
                    recvs.setdefault((s + 1, s), []).append(a.mb_idx)
    edges = [(s, s + 1) for s in range(last)] + [(s + 1, s) for s in range(last)]
    edges.sort(key=lambda e: (min(e), e[1] < e[0]))
    return tuple(
        P2PStream(src, dst, place[src], place[dst], tuple(sends.get((src, dst), ())), tuple(recvs.get((src, dst), ())))
        for src, dst in edges
        if place[src] != place[dst]
    )
