"""The schedule model: per-rank ordered compute actions on (stage, microbatch), and where each stage lives.

Glossary (used everywhere in this package):

- *rank*: one device of the pipeline (a pipeline-parallel rank). ``p`` ranks.
- *stage*: one contiguous slice of the model. A rank holds ``v`` stages (``v`` = virtual stages); ``p × v`` in all.
- *microbatch*: one slice of the step's batch; ``m`` per step.
- *action*: one compute kernel of a stage on a microbatch: ``F`` forward, ``B`` full backward, ``I`` backward for the
  input gradient, ``W`` backward for the weight gradient (``I`` + ``W`` together replace ``B``).
- *placement*: stage → rank. *looped*: stage ``s`` on rank ``s mod p``; *V-shaped*: rank ``r`` holds stages ``r`` and
  ``2p − 1 − r`` (so the last stage comes back to rank 0).

Actions print the way ``torch.distributed.pipelining`` prints them: ``"<stage_idx><kind><mb_idx>"``, e.g. ``"0F0"``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Action", "Kind", "Schedule", "ScheduleError", "looped_placement", "v_placement"]


class Kind(enum.StrEnum):
    """Kind of compute action, spelled as in torch's schedule IR."""

    F = "F"
    """forward"""
    B = "B"
    """full backward (input and weight gradients at once)"""
    I = "I"  # noqa: E741 - torch's spelling of "backward input"
    """backward for the input gradient only (zero-bubble split backward)"""
    W = "W"
    """backward for the weight gradient only; needs the same microbatch's ``I`` first"""


_ACTION_RE = re.compile(r"^(\d+)([A-Z_]+)(\d+)$")


class ScheduleError(ValueError):
    """A schedule that cannot run: malformed, incomplete, or deadlocking. The message names where and why."""


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One compute action: ``kind`` of stage ``stage_idx`` on microbatch ``mb_idx``."""

    stage_idx: int
    kind: Kind
    mb_idx: int

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            object.__setattr__(self, "kind", Kind(self.kind))

    def __str__(self) -> str:
        return f"{self.stage_idx}{self.kind.value}{self.mb_idx}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse torch's spelling (``"0F0"``, ``"3W12"``); raises ``ValueError`` naming the text and the rule."""
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ValueError(
                f"action {text!r} is not of the form <stage><kind><microbatch> with kind one of F, B, I, W "
                "(e.g. '0F0', '3B1')"
            )
        stage, kind, mb = match.groups()
        if kind not in Kind.__members__:
            hint = " (communication and resharding actions are not allowed in a compute-only schedule)"
            raise ValueError(f"action {text!r} has unknown kind {kind!r}; expected one of F, B, I, W{hint}")
        return cls(int(stage), Kind(kind), int(mb))


def looped_placement(ranks: int, virtual_stages: int) -> tuple[int, ...]:
    """Stage ``s`` on rank ``s mod ranks`` (GPipe, 1F1B, interleaved schedules)."""
    return tuple(s % ranks for s in range(ranks * virtual_stages))


def v_placement(ranks: int, virtual_stages: int) -> tuple[int, ...]:
    """Stages zig-zag over the ranks: down 0..p−1, back up p−1..0, and so on (ZB-V: rank r holds r and 2p−1−r)."""
    out: list[int] = []
    for s in range(ranks * virtual_stages):
        chunk, offset = divmod(s, ranks)
        out.append(offset if chunk % 2 == 0 else ranks - 1 - offset)
    return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered compute actions of one training step, plus the stage → rank placement.

    ``ranks[r]`` is rank ``r``'s action order; ``placement[stage_idx]`` is the rank holding that stage.
    Construction does not check anything: :func:`~pipefill.schedules.validate.validate_schedule` does (the generators
    and :func:`~pipefill.schedules.csvio.load_csv` call it). This module imports no other of the package.
    """

    name: str
    ranks: tuple[tuple[Action, ...], ...]
    placement: tuple[int, ...]
    num_microbatches: int

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    @property
    def virtual_stages(self) -> int:
        """Stages per rank (the most any rank holds)."""
        return max((self.placement.count(r) for r in range(self.num_ranks)), default=0)

    @property
    def placement_style(self) -> str:
        """``"looped"``, ``"v"`` or ``"custom"``."""
        p, v = self.num_ranks, self.virtual_stages
        if p * v == self.num_stages:
            if self.placement == looped_placement(p, v):
                return "looped"
            if self.placement == v_placement(p, v):
                return "v"
        return "custom"

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Stage indices held by ``rank``, ascending."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    def order_dict(self) -> dict[str, list[str]]:
        """Every rank's order in torch's spelling, keyed by the rank as a string (JSON-ready)."""
        return {str(r): [str(a) for a in actions] for r, actions in enumerate(self.ranks)}

    @classmethod
    def from_orders(
        cls, name: str, orders: Sequence[Sequence[Action]], placement: Sequence[int], microbatches: int
    ) -> Schedule:
        return cls(name, tuple(tuple(o) for o in orders), tuple(placement), microbatches)
