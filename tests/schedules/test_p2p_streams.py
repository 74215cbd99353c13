"""Point-to-point stream orders (issue #5): NCCL ignores tags and matches a communicator's messages in posting order.

With one communicator per stream (the trainer's design) a match needs each stream's receives posted in its send
order. The control models the design before: all streams between two ranks on one communicator, each rank posting in
its own action order — which mismatches the zero-bubble schedules.
"""

from __future__ import annotations

import pytest

from pipefill.schedules import Kind, Schedule, build_schedule, load_csv
from pipefill.schedules.validate import p2p_streams


def _build(name: str, ranks: int, v: int, m: int) -> Schedule | None:
    try:
        return build_schedule(name, ranks=ranks, microbatches=m, virtual_stages=v)
    except ValueError:  # e.g. interleaved needs m divisible by the ranks
        return None


GRID = [  # every schedule that exists for 2-5 ranks and ranks..3·ranks microbatches
    (name, ranks, v, m)
    for name, vs in [
        ("gpipe", [1]),
        ("1f1b", [1]),
        ("interleaved-1f1b", [2, 3]),
        ("zero-bubble-h1", [2, 3]),
        ("zbv", [2]),
    ]
    for ranks in range(2, 6)
    for v in vs
    for m in range(ranks, 3 * ranks + 1)
    if _build(name, ranks, v, m) is not None
]


def _one_channel_per_pair(schedule: Schedule) -> str | None:
    """First message the pre-#5 design delivers to the wrong action (one channel per directed rank pair, sends and
    receives posted in each rank's action order), or None when every message lands where it belongs."""
    place, last = schedule.placement, schedule.num_stages - 1
    sent: dict[tuple[int, int], list[str]] = {}
    posted: dict[tuple[int, int], list[str]] = {}
    for rank, actions in enumerate(schedule.ranks):
        for a in actions:
            s, mb = a.stage_idx, a.mb_idx
            edges_out, edges_in = [], []
            if a.kind is Kind.F:
                edges_out = [(s, s + 1)] if s < last else []
                edges_in = [(s - 1, s)] if s > 0 else []
            elif a.kind in (Kind.B, Kind.I):
                edges_out = [(s, s - 1)] if s > 0 else []
                edges_in = [(s + 1, s)] if s < last else []
            for src, dst in edges_out:
                if place[dst] != rank:
                    sent.setdefault((rank, place[dst]), []).append(f"{src}->{dst} mb {mb}")
            for src, dst in edges_in:
                if place[src] != rank:
                    posted.setdefault((place[src], rank), []).append(f"{src}->{dst} mb {mb}")
    for pair, sends in sorted(sent.items()):
        for k, (got, wanted) in enumerate(zip(sends, posted[pair], strict=True)):
            if got != wanted:
                return f"rank {pair[0]} -> {pair[1]}, message #{k}: sent {got}, received as {wanted}"
    return None


@pytest.mark.parametrize(("name", "ranks", "v", "m"), GRID)
def test_every_builtin_schedule_sends_and_consumes_each_stream_in_one_order(
    name: str, ranks: int, v: int, m: int
) -> None:
    schedule = build_schedule(name, ranks=ranks, microbatches=m, virtual_stages=v)
    place = schedule.placement
    cross = {(s, s + 1) for s in range(schedule.num_stages - 1) if place[s] != place[s + 1]}
    streams = p2p_streams(schedule)
    assert {(st.src_stage, st.dst_stage) for st in streams} == cross | {(d, s) for s, d in cross}
    for st in streams:
        assert sorted(st.send_order) == list(range(m)), st
        assert st.send_order == st.recv_order, st
        assert (st.src_rank, st.dst_rank) == (place[st.src_stage], place[st.dst_stage])


def test_one_channel_per_rank_pair_mismatches_the_zero_bubble_schedules() -> None:
    broken: dict[str, list[tuple[int, int, int]]] = {}
    for name, ranks, v, m in GRID:
        if _one_channel_per_pair(build_schedule(name, ranks=ranks, microbatches=m, virtual_stages=v)) is not None:
            broken.setdefault(name, []).append((ranks, v, m))
    # the others have one stream per direction between two ranks, or streams whose orders happen to interleave alike
    assert set(broken) == {"zero-bubble-h1", "zbv"}
    assert broken["zbv"] == [(r, v, m) for n, r, v, m in GRID if n == "zbv" and m > r]  # all with a steady state
    assert broken["zero-bubble-h1"] == [(2, v, m) for n, r, v, m in GRID if n == "zero-bubble-h1" and r == 2 < m]
    # what goes wrong, in the configuration of the gradient-equivalence control run
    schedule = build_schedule("zbv", ranks=2, microbatches=4)
    assert _one_channel_per_pair(schedule) == "rank 0 -> 1, message #2: sent 0->1 mb 2, received as 3->2 mb 0"


def test_a_custom_schedule_consuming_in_another_order_is_valid_and_its_receives_follow_the_sender() -> None:
    schedule = load_csv("0F0,0F1,0B0,0B1\n1F1,1B1,1F0,1B0\n")
    act, grad = p2p_streams(schedule)
    assert (act.src_stage, act.dst_stage, act.send_order, act.recv_order) == (0, 1, (0, 1), (1, 0))
    assert (grad.src_stage, grad.dst_stage, grad.send_order, grad.recv_order) == (1, 0, (1, 0), (0, 1))
    assert act.reordered and grad.reordered and grad.is_grad and not act.is_grad
    assert str(grad) == "stage 1 -> 0 input gradients (rank 1 -> 0)"


def test_streams_come_in_one_canonical_order_without_same_rank_edges() -> None:
    zbv = build_schedule("zbv", ranks=2, microbatches=4)  # stages 0 1 | 2 3 on ranks 0 1 1 0: edge 1-2 is local
    assert [(st.src_stage, st.dst_stage) for st in p2p_streams(zbv)] == [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert p2p_streams(zbv) == p2p_streams(build_schedule("zbv", ranks=2, microbatches=4))
    assert p2p_streams(build_schedule("gpipe", ranks=1, microbatches=2)) == ()
