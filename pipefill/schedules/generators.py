"""Schedule generators: GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble (ZB-H1) and ZB-V.

Each generator yields the compute order torch 2.13's ``torch.distributed.pipelining`` executes for the same
(ranks, microbatches, virtual stages) — the tests compare them action by action — written from the published
algorithms (GPipe; Narayanan et al. 2021 for 1F1B and interleaving; Qi et al. 2024 for zero bubble and ZB-V).
Where torch rejects a combination, :func:`build_schedule` rejects it too, with the rule and a fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pipefill.schedules.csvio import load_csv
from pipefill.schedules.model import Action, Kind, Schedule, ScheduleError, looped_placement, v_placement
from pipefill.schedules.validate import validate_schedule

__all__ = ["PARAMETER_NAMES", "SCHEDULE_NAMES", "ScheduleRuleError", "build_schedule", "canonical_name"]

SCHEDULE_NAMES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble-h1", "zbv", "custom")

# Also accepted: torch's class names and spellings without dashes.
_ALIASES: dict[str, str] = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "zerobubbleh1": "zero-bubble-h1",
    "zbh1": "zero-bubble-h1",
    "interleavedzerobubble": "zero-bubble-h1",
    "zbv": "zbv",
    "zbvzerobubble": "zbv",
    "custom": "custom",
}


PARAMETER_NAMES: dict[str, str] = {"ranks": "ranks", "microbatches": "microbatches", "virtual_stages": "virtual_stages"}
"""How :func:`build_schedule` names its parameters in messages; a caller renders a :class:`ScheduleRuleError` with its
own names (a spec's field paths, a command's flags)."""


class ScheduleRuleError(ValueError):
    """A combination of ``ranks``, ``microbatches`` and ``virtual_stages`` a schedule cannot run.

    ``param`` is the parameter to change, ``value`` its value, ``rule`` the rule and ``text`` the message with the fix,
    both with ``{ranks}``, ``{microbatches}`` and ``{virtual_stages}`` where the parameters' names go, so that
    :meth:`render` can name them as the caller knows them.
    """

    def __init__(self, *, param: str, value: object, rule: str, text: str) -> None:
        self.param, self.value, self.rule, self.text = param, value, rule, text
        super().__init__(self.render(PARAMETER_NAMES))

    def render(self, names: dict[str, str]) -> str:
        return self.text.format(**names)

    def rendered_rule(self, names: dict[str, str]) -> str:
        return self.rule.format(**names)


def canonical_name(name: str) -> str:
    """Map a schedule name (case-insensitive, dashes/underscores ignored, torch class names accepted) to ours."""
    key = name.lower().replace("-", "").replace("_", "").removeprefix("schedule")
    if key not in _ALIASES:
        raise ValueError(f"schedule {name!r} is unknown; choose one of {', '.join(SCHEDULE_NAMES)}")
    return _ALIASES[key]


def build_schedule(
    name: str,
    *,
    ranks: int,
    microbatches: int,
    virtual_stages: int | None = None,
    csv_text: str | None = None,
) -> Schedule:
    """Build and validate a schedule.

    ``ranks``: pipeline ranks ``p`` (≥ 1). ``microbatches``: ``m`` per step (≥ 1). ``virtual_stages``: stages per rank
    ``v``; default 1, except ``zbv`` (always 2) and ``custom`` (inferred from the CSV, checked when given).
    ``csv_text``: the schedule for ``custom``, in torch's compute-only CSV format (one row per rank).
    """
    canon = canonical_name(name)
    _check_positive("ranks", ranks)
    _check_positive("microbatches", microbatches)
    _check_rules(canon, ranks=ranks, microbatches=microbatches, virtual_stages=virtual_stages)
    if canon == "custom":
        return _custom(csv_text, ranks=ranks, microbatches=microbatches, virtual_stages=virtual_stages)
    if csv_text is not None:
        raise ValueError(f"csv_text is only read by schedule 'custom', not {canon!r}; drop it or use 'custom'")
    v = virtual_stages if virtual_stages is not None else (2 if canon == "zbv" else 1)
    return _generated(canon, ranks, microbatches, v)


@functools.lru_cache(maxsize=256)
def _generated(canon: str, ranks: int, microbatches: int, v: int) -> Schedule:
    """A generated schedule, built and validated once per shape (a Schedule is immutable): the operator derives the
    shape of every job it admits and reconciles, and a thousand jobs of one shape are common."""
    orders = [_GENERATORS[canon](r, ranks, microbatches, v) for r in range(ranks)]
    placement = v_placement(ranks, v) if canon == "zbv" else looped_placement(ranks, v)
    schedule = Schedule.from_orders(canon, orders, placement, microbatches)
    validate_schedule(schedule)
    return schedule


def _check_positive(field: str, value: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleRuleError(
            param=field,
            value=value,
            rule=f"{{{field}}} >= 1",
            text=f"{{{field}}} must be a positive integer, got {value!r}",
        )


def _check_rules(canon: str, *, ranks: int, microbatches: int, virtual_stages: int | None) -> None:
    """The rules of ``canon`` on (ranks, microbatches, virtual stages) torch's schedules enforce too (custom: the CSV's)."""
    if canon == "custom":
        return
    v = virtual_stages if virtual_stages is not None else (2 if canon == "zbv" else 1)
    _check_positive("virtual_stages", v)
    if canon in ("gpipe", "1f1b") and v != 1:
        raise ScheduleRuleError(
            param="virtual_stages",
            value=v,
            rule=f"schedule {canon}: {{virtual_stages}} == 1",
            text=f"schedule {canon!r} holds one stage per rank, got {{virtual_stages}}={v}; use "
            "'interleaved-1f1b' or 'zero-bubble-h1' for several stages per rank",
        )
    if canon == "1f1b" and microbatches < ranks:
        raise ScheduleRuleError(
            param="microbatches",
            value=microbatches,
            rule="schedule 1f1b: {microbatches} >= {ranks}",
            text=f"schedule '1f1b' needs {{microbatches}} >= {{ranks}}, got {{microbatches}}={microbatches} < "
            f"{{ranks}}={ranks}; raise {{microbatches}} to at least {ranks} or use schedule 'gpipe'",
        )
    if canon == "zbv" and v != 2:
        raise ScheduleRuleError(
            param="virtual_stages",
            value=v,
            rule="schedule zbv: {virtual_stages} == 2",
            text=f"schedule 'zbv' holds exactly 2 stages per rank (V-shaped), got {{virtual_stages}}={v}; set it to 2",
        )
    if canon in ("interleaved-1f1b", "zero-bubble-h1"):
        rounds = max(1, microbatches // ranks)
        if microbatches % rounds:
            fits = [k * ranks for k in (microbatches // ranks, microbatches // ranks + 1) if k]
            raise ScheduleRuleError(
                param="microbatches",
                value=microbatches,
                rule=f"schedule {canon}: {{microbatches}} % max(1, {{microbatches}} // {{ranks}}) == 0",
                text=f"schedule {canon!r} needs {{microbatches}} to be a multiple of the rounds max(1, "
                f"{{microbatches}} // {{ranks}}) = {rounds}, got {{microbatches}}={microbatches} with "
                f"{{ranks}}={ranks}; use a multiple of {{ranks}} such as {' or '.join(map(str, fits))}",
            )


def _custom(csv_text: str | None, *, ranks: int, microbatches: int, virtual_stages: int | None) -> Schedule:
    if csv_text is None:
        raise ValueError("schedule 'custom' needs csv_text: torch's compute-only CSV, one row per rank")
    schedule = load_csv(csv_text, microbatches=microbatches, ranks=ranks)
    if virtual_stages is not None and schedule.virtual_stages != virtual_stages:
        raise ScheduleError(
            f"custom schedule holds {schedule.virtual_stages} stages per rank, but virtual_stages={virtual_stages}; "
            "fix the CSV or the virtual_stages setting"
        )
    return schedule


def _gpipe(rank: int, p: int, m: int, v: int) -> list[Action]:
    # all forwards, then all backwards, microbatches in order
    return [Action(rank, Kind.F, i) for i in range(m)] + [Action(rank, Kind.B, i) for i in range(m)]


def _one_f_one_b(rank: int, p: int, m: int, v: int) -> list[Action]:
    # The order torch executes (its pipeline_order table differs on the last rank): min(m, p − rank) warm-up
    # forwards, then backward/forward pairs, then the remaining backwards.
    warmup = min(m, p - rank)
    out = [Action(rank, Kind.F, i) for i in range(warmup)]
    for b in range(m):
        out.append(Action(rank, Kind.B, b))
        if warmup + b < m:
            out.append(Action(rank, Kind.F, warmup + b))
    return out


def _interleaved(rank: int, p: int, m: int, v: int, *, zero_bubble: bool) -> list[Action]:
    """Depth-first interleaving over the rank's ``v`` stages, in rounds of ``m // max(1, m // p)`` microbatches.

    Forward number ``k`` (0 ≤ k < m·v) runs on local stage ``(k // per_round) mod v``; backward number ``k`` on local
    stage ``v − 1 − (k // per_round) mod v``; each stage takes its microbatches in order. After ``warmup`` forwards the
    rank alternates forward/backward, then drains the backwards. With ``zero_bubble``, backwards are ``I`` and the
    ``W`` of backward ``k`` runs right after backward ``k + rank`` (a lag of ``rank``), the rest at the end.
    """
    per_round = m // max(1, m // p)
    ops = m * v
    hops = (p - 1 - rank) * (1 if zero_bubble else 2)
    warmup = min((v - 1) * per_round + hops, ops)
    grad_kind = Kind.I if zero_bubble else Kind.B

    def numbered(kind: Kind, local_of: Callable[[int], int]) -> list[Action]:
        seen = [0] * v
        out: list[Action] = []
        for k in range(ops):
            local = local_of(k)
            out.append(Action(local * p + rank, kind, seen[local]))
            seen[local] += 1
        return out

    fwd = numbered(Kind.F, lambda k: (k // per_round) % v)
    bwd = numbered(grad_kind, lambda k: v - 1 - (k // per_round) % v)
    weights = [Action(a.stage_idx, Kind.W, a.mb_idx) for a in bwd]
    out = fwd[:warmup]
    for k in range(ops):
        if warmup + k < ops:
            out.append(fwd[warmup + k])
        out.append(bwd[k])
        if zero_bubble and k >= rank:
            out.append(weights[k - rank])
    if zero_bubble:
        out.extend(weights[max(0, ops - rank) :])
    return out


def _zbv(rank: int, p: int, m: int, v: int) -> list[Action]:
    """ZB-V (Qi et al. 2024, section 6): rank ``r`` holds stage ``r`` (chunk 0) and ``2p − 1 − r`` (chunk 1).

    Built for ``n = max(2p − 1, m)`` microbatches, then actions on microbatches ≥ m are dropped (torch does the same).
    """
    n = max(2 * p - 1, m)
    c0, c1 = rank, 2 * p - 1 - rank
    nxt = {(c, k): 0 for c in (c0, c1) for k in Kind}
    out: list[Action] = []

    def emit(stage: int, kind: Kind) -> None:
        out.append(Action(stage, kind, nxt[stage, kind]))
        nxt[stage, kind] += 1

    for _ in range(2 * (p - rank) - 1):  # warm-up: fill chunk 0 down the V
        emit(c0, Kind.F)
    for _ in range(rank):
        emit(c1, Kind.F)
        emit(c0, Kind.F)
    for _ in range(p - rank):  # chunk 1 starts its backwards at the bottom of the V
        emit(c1, Kind.F)
        emit(c1, Kind.I)
        emit(c1, Kind.W)
    while nxt[c1, Kind.F] < nxt[c0, Kind.F] or nxt[c0, Kind.F] < n:  # steady: F I W on each chunk
        if nxt[c0, Kind.F] < n:
            emit(c0, Kind.F)
        emit(c0, Kind.I)
        emit(c0, Kind.W)
        emit(c1, Kind.F)
        emit(c1, Kind.I)
        emit(c1, Kind.W)
    for _ in range(rank):  # cool-down: input grads first, weight grads fill the drain
        emit(c0, Kind.I)
        emit(c1, Kind.I)
    for _ in range(p - rank):
        emit(c0, Kind.I)
        emit(c0, Kind.W)
    while nxt[c1, Kind.W] < nxt[c1, Kind.I]:
        emit(c1, Kind.W)
    while nxt[c0, Kind.W] < nxt[c0, Kind.I]:
        emit(c0, Kind.W)
    return [a for a in out if a.mb_idx < m]


_GENERATORS: dict[str, Callable[[int, int, int, int], list[Action]]] = {
    "gpipe": _gpipe,
    "1f1b": _one_f_one_b,
    "interleaved-1f1b": lambda r, p, m, v: _interleaved(r, p, m, v, zero_bubble=False),
    "zero-bubble-h1": lambda r, p, m, v: _interleaved(r, p, m, v, zero_bubble=True),
    "zbv": _zbv,
}
