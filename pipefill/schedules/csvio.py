"""torch.distributed.pipelining's compute-only CSV format, read and written.

One row per rank (row 1 = rank 0), one action per cell in torch's spelling (``0F0``, ``5I3``, ``5W3``, ``2B1``).
Empty cells are idle slots in torch's table (``_dump_csv`` writes ``None`` as an empty cell) and are skipped.
Communication actions (``SEND_F``, ``RECV_B``, ``UNSHARD``…) belong to torch's ``compute_comms`` format and are
rejected. The placement is read from the file: each stage must appear on exactly one rank.
We write what torch's ``_dump_csv(format="compute_only")`` writes (``csv`` module, ``\\r\\n`` line ends) minus the
idle cells, so ``load_csv(dump_csv(s)) == s`` and torch's ``_load_csv`` reads our files.
"""

from __future__ import annotations

import csv
import io

from pipefill.schedules.model import Action, Schedule, ScheduleError
from pipefill.schedules.validate import validate_schedule

__all__ = ["dump_csv", "load_csv"]


def dump_csv(schedule: Schedule) -> str:
    """Render ``schedule`` as compute-only CSV text."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for actions in schedule.ranks:
        writer.writerow([str(a) for a in actions])
    return buf.getvalue()


def load_csv(
    text: str,
    *,
    microbatches: int | None = None,
    ranks: int | None = None,
    name: str = "custom",
    validate: bool = True,
) -> Schedule:
    """Parse compute-only CSV text into a :class:`Schedule` (validated unless ``validate=False``).

    ``microbatches``: ``m``; default: one more than the largest microbatch index in the file (a missing microbatch
    is then only caught if it is not the last one — pass ``m`` when you know it). ``ranks``: expected row count.
    """
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()  # trailing blank lines
    if not rows:
        raise ScheduleError("schedule CSV is empty; expected one row of actions per rank, e.g. '0F0,0F1,0B0,0B1'")
    if ranks is not None and len(rows) != ranks:
        raise ScheduleError(f"schedule CSV has {len(rows)} rows but the pipeline has {ranks} ranks; one row per rank")
    orders: list[list[Action]] = []
    stage_rank: dict[int, tuple[int, int, str]] = {}  # stage -> (rank, column, cell) of its first appearance
    for r, row in enumerate(rows):
        order: list[Action] = []
        for col, cell in enumerate(row):
            if not cell.strip():
                continue
            try:
                action = Action.parse(cell)
            except ValueError as exc:
                raise ScheduleError(f"row {r + 1} (rank {r}), column {col + 1}: {exc}") from None
            first = stage_rank.setdefault(action.stage_idx, (r, col, cell.strip()))
            if first[0] != r:
                raise ScheduleError(
                    f"row {r + 1} (rank {r}), column {col + 1}: action '{action}' puts stage {action.stage_idx} on "
                    f"rank {r}, but row {first[0] + 1} column {first[1] + 1} ('{first[2]}') put it on rank "
                    f"{first[0]}; each stage runs on exactly one rank"
                )
            order.append(action)
        if not order:
            raise ScheduleError(f"row {r + 1} (rank {r}) has no actions; every rank must hold at least one stage")
        orders.append(order)
    num_stages = max(stage_rank) + 1
    for s in range(num_stages):
        if s not in stage_rank:
            raise ScheduleError(f"stage {s} appears on no row, but stages up to {num_stages - 1} do; add its actions")
    m = microbatches if microbatches is not None else 1 + max(a.mb_idx for o in orders for a in o)
    placement = tuple(stage_rank[s][0] for s in range(num_stages))
    schedule = Schedule.from_orders(name, orders, placement, m)
    if validate:
        validate_schedule(schedule)
    return schedule
