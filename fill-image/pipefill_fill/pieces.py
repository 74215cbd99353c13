"""Partial steps (issue #25): an optional extension of the workload SDK for a step that runs in pieces — one layer,
or a block of layers, of one batch at a time; forward, and for training backward — so a bubble too short for a
whole batch still advances one, and the next bubble goes on where it stopped.

A workload offers it by subclassing :class:`PieceSteps` (before its base: ``class W(PieceSteps, SampleWorkload)``)
and implementing four methods:

``pieces(batch_size) -> int``
    how many pieces a batch of that size runs in (≥ 1);
``start_batch(batch_size) -> object | None``
    the batch's inputs on the device: the next ``batch_size`` units **without moving the workload's position**
    (None: nothing left);
``run_piece(carry, index) -> object``
    piece ``index`` (0 … pieces − 1) of the batch: takes what the piece before left (``carry``: activations, for
    training the autograd graph) and returns what the next one needs; it stays on the device between bubbles;
``finish_batch(carry) -> int``
    after the last piece: hand the outputs over (``context.emit``), move the position, return the units done.

Rules, so exactly-once holds unchanged: ``state()`` always returns the state at the last whole-batch boundary (a batch
in flight changes nothing ``state()`` returns before ``finish_batch``: the position moves there, an optimizer steps in
the last piece), and ``restore(state)`` drops the batch in flight (:meth:`PieceSteps.restore` does it for a
workload that does not override ``restore``; one that does calls :meth:`drop_in_flight`). A crash loses at most the
batch in flight, which is redone from the last commit. The pieces must compute what ``step`` computes, so a batch
run in pieces gives the same outputs (the same weights, for training) as a whole ``step``.

The executor calls :meth:`step_piece` (one piece; a new batch when none is in flight), :meth:`in_flight` and
:meth:`drop_in_flight`; a workload without the extension runs whole steps as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Flight", "PieceSteps", "piece_steps"]


@dataclass
class Flight:
    """The batch in flight: its size, pieces done of ``pieces``, and what the next piece takes."""

    batch_size: int
    pieces: int
    done: int
    carry: Any


class PieceSteps:
    """Mixin: the executor's side of partial steps, on top of the four methods a workload implements."""

    _flight: Flight | None = None

    def pieces(self, batch_size: int) -> int:
        raise NotImplementedError

    def start_batch(self, batch_size: int) -> Any:
        raise NotImplementedError

    def run_piece(self, carry: Any, index: int) -> Any:
        raise NotImplementedError

    def finish_batch(self, carry: Any) -> int:
        raise NotImplementedError

    def step_piece(self, batch_size: int) -> int:
        """The next piece of the batch in flight, or the first of a new batch of ``batch_size`` when none is; returns
        the units the batch completed (0 before its last piece, and when nothing is left)."""
        flight = self._flight
        if flight is None:
            carry = self.start_batch(batch_size)
            if carry is None:
                return 0
            flight = self._flight = Flight(batch_size, max(1, int(self.pieces(batch_size))), 0, carry)
        flight.carry = self.run_piece(flight.carry, flight.done)
        flight.done += 1
        if flight.done < flight.pieces:
            return 0
        self._flight = None
        return int(self.finish_batch(flight.carry))

    def in_flight(self) -> Flight | None:
        """The batch in flight (None: the workload is at a whole-batch boundary)."""
        return self._flight

    def drop_in_flight(self) -> None:
        """Forget the batch in flight (it was never committed: it is redone from the state restored)."""
        self._flight = None

    def restore(self, state: dict[str, Any]) -> None:
        self.drop_in_flight()
        super().restore(state)  # type: ignore[misc]


def piece_steps(workload: object) -> PieceSteps | None:
    """``workload`` when it runs its steps in pieces, else None."""
    return workload if isinstance(workload, PieceSteps) else None
