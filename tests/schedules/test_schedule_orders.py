"""Our generators against torch.distributed.pipelining 2.13 (the oracle), and CSV exchange with torch.

torch is a test-only dependency: its schedules compute ``pipeline_order`` in the constructor, which needs no process
group when the stage objects are duck-typed (the attributes the constructors read are set below).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipefill.schedules import build_schedule, dump_csv, load_csv

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

TORCH_CLASSES: dict[str, Any] = {
    "gpipe": schedules.ScheduleGPipe,
    "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
    "zero-bubble-h1": schedules.ScheduleInterleavedZeroBubble,
    "zbv": schedules.ScheduleZBVZeroBubble,
}
COMPUTE = {"F", "B", "I", "W"}


def _stage(num_stages: int, stage_idx: int, ranks: int) -> SimpleNamespace:
    return SimpleNamespace(
        num_stages=num_stages,
        stage_index=stage_idx,
        group_size=ranks,
        group_rank=0,
        submod=None,
        is_first=stage_idx == 0,
        is_last=stage_idx == num_stages - 1,
    )


def torch_schedule(name: str, ranks: int, microbatches: int, virtual_stages: int) -> Any:
    cls = TORCH_CLASSES[name]
    if name == "gpipe":
        return cls(_stage(ranks, 0, ranks), microbatches)
    n = ranks * virtual_stages
    local = [0, n - 1] if name == "zbv" else [i * ranks for i in range(virtual_stages)]
    return cls([_stage(n, s, ranks) for s in local], microbatches)


def compute_only(order: dict[int, list[Any]]) -> dict[str, list[str]]:
    return {
        str(rank): [str(a) for a in actions if a is not None and a.computation_type.value in COMPUTE]
        for rank, actions in order.items()
    }


GRID = [
    (name, ranks, v)
    for name in TORCH_CLASSES
    for ranks in range(2, 9)
    for v in ({"gpipe": [1], "zbv": [2]}.get(name, [1, 2, 3]))
]


@pytest.mark.parametrize(("name", "ranks", "virtual_stages"), GRID)
def test_order_equals_torch(name: str, ranks: int, virtual_stages: int) -> None:
    compared = 0
    for m in range(ranks, 4 * ranks + 1):
        try:
            expected = compute_only(torch_schedule(name, ranks, m, virtual_stages).pipeline_order)
        except ValueError:
            with pytest.raises(ValueError, match=r"microbatches"):
                build_schedule(name, ranks=ranks, microbatches=m, virtual_stages=virtual_stages)
            continue
        ours = build_schedule(name, ranks=ranks, microbatches=m, virtual_stages=virtual_stages)
        assert ours.order_dict() == expected, f"m={m}"
        compared += 1
    assert compared >= 3  # the grid is not vacuous


def executed_1f1b(ranks: int, m: int) -> dict[str, list[str]]:
    """What torch's Schedule1F1B._step_microbatches runs (its pipeline_order table is wrong on the last rank)."""
    out = {}
    for r in range(ranks):
        warmup = min(m, ranks - r)
        order = [f"{r}F{i}" for i in range(warmup)]
        for b in range(m):
            order.append(f"{r}B{b}")
            if warmup + b < m:
                order.append(f"{r}F{warmup + b}")
        out[str(r)] = order
    return out


@pytest.mark.parametrize("ranks", range(2, 9))
def test_1f1b_equals_torch_execution(ranks: int) -> None:
    for m in range(ranks, 4 * ranks + 1):
        assert build_schedule("1f1b", ranks=ranks, microbatches=m).order_dict() == executed_1f1b(ranks, m)
    with pytest.raises(ValueError):  # torch: "Number of microbatches (...) must be greater than or equal to ..."
        schedules.Schedule1F1B(_stage(ranks, 0, ranks), ranks - 1)
    with pytest.raises(ValueError, match=r"microbatches >= ranks"):
        build_schedule("1f1b", ranks=ranks, microbatches=ranks - 1)


def test_torch_1f1b_table_is_still_wrong_on_the_last_rank() -> None:
    """If this fails, torch fixed Schedule1F1B.pipeline_order: compare against it directly and drop executed_1f1b."""
    table = compute_only(schedules.Schedule1F1B(_stage(4, 3, 4), 8).pipeline_order)
    assert table["3"][0] != "3F0"
    assert table["3"] != executed_1f1b(4, 8)["3"]


@pytest.mark.parametrize(("name", "virtual_stages"), [("interleaved-1f1b", 2), ("zero-bubble-h1", 2), ("zbv", 2)])
def test_torch_csv_dump_loads_as_our_schedule(tmp_path: Path, name: str, virtual_stages: int) -> None:
    path = tmp_path / "schedule.csv"
    torch_schedule(name, 4, 8, virtual_stages)._dump_csv(str(path), format="compute_only")
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert any(cell == "" for row in rows for cell in row)  # torch writes idle slots as empty cells; we skip them
    loaded = load_csv(path.read_text(), microbatches=8)
    generated = build_schedule(name, ranks=4, microbatches=8, virtual_stages=virtual_stages)
    assert loaded.ranks == generated.ranks
    assert loaded.placement == generated.placement


@pytest.mark.parametrize(("name", "virtual_stages"), [("interleaved-1f1b", 2), ("zero-bubble-h1", 3), ("zbv", 2)])
def test_torch_loads_our_csv(tmp_path: Path, name: str, virtual_stages: int) -> None:
    ours = build_schedule(name, ranks=4, microbatches=8, virtual_stages=virtual_stages)
    path = tmp_path / "schedule.csv"
    path.write_text(dump_csv(ours), newline="")
    runtime = torch_schedule(name, 4, 8, virtual_stages)
    runtime._load_csv(str(path), format="compute_only")  # torch validates it and lowers it to send/recv
    assert compute_only(runtime.pipeline_order) == ours.order_dict()
