"""Timeline simulator: bubble fractions against the closed forms, bubble kinds and positions, memory, costs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipefill.schedules import (
    BUBBLE_KINDS,
    Costs,
    FillProfile,
    Kind,
    MemoryModel,
    build_schedule,
    project_fill,
    simulate,
)

GiB = 1 << 30
SHAPES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 4 * p)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_gpipe_and_1f1b_bubble_fraction_is_closed_form(name: str, p: int, m: int) -> None:
    timeline = simulate(build_schedule(name, ranks=p, microbatches=m), Costs.uniform())
    assert timeline.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1))
    for r in range(p):  # every rank idles the same (p − 1)(F + B)
        assert timeline.idle_s(r) == pytest.approx((p - 1) * 3)


@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_interleaving_divides_the_fill_drain_by_v(p: int, m: int, v: int) -> None:
    # the same model cut into v times more stages: each stage does 1/v of the work
    costs = Costs.uniform(f_s=1 / v, i_s=1 / v, w_s=1 / v)
    timeline = simulate(build_schedule("interleaved-1f1b", ranks=p, microbatches=m, virtual_stages=v), costs)
    bubble = (p - 1) / v  # Narayanan et al. 2021: the pipeline bubble shrinks by v
    assert timeline.bubble_fraction() == pytest.approx(bubble / (m + bubble))


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_zero_bubble_h1_is_a_third_of_1f1b(p: int, m: int) -> None:
    one_f_one_b = simulate(build_schedule("1f1b", ranks=p, microbatches=m), Costs.uniform())
    zb = simulate(build_schedule("zero-bubble-h1", ranks=p, microbatches=m), Costs.uniform())
    assert zb.step_s < one_f_one_b.step_s
    for r in range(p):
        assert zb.idle_s(r) == pytest.approx(one_f_one_b.idle_s(r) / 3)


@pytest.mark.parametrize(("p", "m"), [(2, 8), (4, 8), (4, 16), (8, 32), (8, 64)])
def test_zbv_leaves_only_the_start_up_skew(p: int, m: int) -> None:
    costs = Costs.uniform(f_s=0.5, i_s=0.5, w_s=0.5)  # two stages per rank: half a 1F1B stage each
    timeline = simulate(build_schedule("zbv", ranks=p, microbatches=m), costs)
    for rt in timeline.ranks:
        # no bubble inside the step: only rank r's wait for its first input (r F) and its matching early finish
        assert {b.kind for b in rt.bubbles} <= {"warm-up", "end-of-step"}
        assert all(b.before_action_idx in (0, len(rt.actions)) for b in rt.bubbles)
        assert timeline.idle_s(rt.rank) == pytest.approx((p - 1) * 0.5)
    # the skew does not grow with m: (p − 1)·F of 6·m·F of work per rank, → 0 as m grows
    assert timeline.bubble_fraction() == pytest.approx((p - 1) / (6 * m + p - 1))
    one_f_one_b = simulate(build_schedule("1f1b", ranks=p, microbatches=m), Costs.uniform())
    assert timeline.bubble_fraction() < one_f_one_b.bubble_fraction() / 3


def test_1f1b_bubbles_by_kind_and_position() -> None:
    timeline = simulate(build_schedule("1f1b", ranks=4, microbatches=8), Costs.uniform())
    first = timeline.bubbles(0)
    # rank 0: 4 forwards, then waits 2·3 slots of F+B... for the first gradient: 3 F + 3 B = 6 units
    assert (first[0].kind, first[0].start_s, first[0].duration_s, first[0].before_action_idx) == ("warm-up", 4, 6, 4)
    assert [b.kind for b in first[1:]] == ["cool-down"] * 3
    last = timeline.bubbles(3)
    assert [(b.kind, b.start_s, b.duration_s) for b in last] == [("warm-up", 0, 3), ("end-of-step", 27, 6)]
    assert last[-1].before_action_idx == len(timeline.ranks[3].actions)
    for rt in timeline.ranks:
        for b in rt.bubbles:
            assert b.kind in BUBBLE_KINDS
            if b.before_action_idx < len(rt.actions):  # the action that ends the bubble starts when it ends
                assert rt.actions[b.before_action_idx].start_s == pytest.approx(b.end_s)


def test_steady_bubbles_appear_when_stages_are_unbalanced() -> None:
    costs = Costs(f_s=(1, 1, 2, 1), b_s=(2, 2, 4, 2), i_s=(1,), w_s=(1,))
    timeline = simulate(build_schedule("1f1b", ranks=4, microbatches=8), costs)
    assert any(b.kind == "steady" for b in timeline.bubbles(3))


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (4, 16), (8, 8), (8, 24)])
def test_1f1b_holds_p_minus_rank_microbatches_gpipe_holds_m(p: int, m: int) -> None:
    one_f_one_b = simulate(build_schedule("1f1b", ranks=p, microbatches=m), Costs.uniform())
    gpipe = simulate(build_schedule("gpipe", ranks=p, microbatches=m), Costs.uniform())
    for r in range(p):
        assert one_f_one_b.ranks[r].peak_in_flight == p - r
        assert gpipe.ranks[r].peak_in_flight == m


def test_free_memory_follows_the_activations_in_flight() -> None:
    memory = MemoryModel(
        device_bytes=80 * GiB,
        static_bytes=(20 * GiB,),
        activation_bytes_per_mb=(2 * GiB,),
        input_bytes_per_mb=(GiB // 8,),
        reserve_bytes=2 * GiB,
    )
    schedule = build_schedule("1f1b", ranks=4, microbatches=8)
    timeline = simulate(schedule, Costs.uniform(), memory)
    warm = timeline.bubbles(0)[0]  # rank 0 waits with its 4 warm-up microbatches in flight
    assert warm.in_flight_mbs == 4
    assert warm.free_bytes == (80 - 2 - 20 - 4 * 2) * GiB
    assert timeline.bubbles(3)[-1].free_bytes == (80 - 2 - 20) * GiB  # end of step: nothing in flight
    assert timeline.ranks[0].peak_used_bytes == (20 + 4 * 2) * GiB
    gpipe = simulate(build_schedule("gpipe", ranks=4, microbatches=8), Costs.uniform(), memory)
    assert gpipe.bubbles(0)[0].free_bytes == (80 - 2 - 20 - 8 * 2) * GiB
    checkpointed = MemoryModel(
        memory.device_bytes,
        memory.static_bytes,
        memory.activation_bytes_per_mb,
        memory.input_bytes_per_mb,
        activation_checkpointing=True,
    )
    assert simulate(schedule, Costs.uniform(), checkpointed).bubbles(0)[0].free_bytes == (80 - 2 - 20) * GiB - GiB // 2


def test_split_backward_keeps_activations_until_w() -> None:
    timeline = simulate(build_schedule("zero-bubble-h1", ranks=4, microbatches=8), Costs.uniform())
    order = [s.action for s in timeline.ranks[3].actions]
    assert any(a.kind is Kind.W for a in order)
    # rank 3 defers each W by 3 backwards, so it holds more than 1F1B's single microbatch
    assert timeline.ranks[3].peak_in_flight == 4


def test_p2p_time_and_step_end_lengthen_the_step() -> None:
    schedule = build_schedule("1f1b", ranks=4, microbatches=8)
    base = simulate(schedule, Costs.uniform())
    slow = Costs(
        f_s=(1,),
        b_s=(2,),
        i_s=(1,),
        w_s=(1,),
        p2p_bytes=(1e6,),
        p2p_latency_s=0.1,
        p2p_bandwidth_bytes_per_s=1e7,
        step_end_s=5.0,
    )
    timeline = simulate(schedule, slow)
    # each send costs 0.1 s + 1e6 B / 1e7 B/s = 0.2 s; the first microbatch alone crosses 3 boundaries each way
    assert slow.p2p_s(0) == pytest.approx(0.2)
    assert timeline.step_s >= base.step_s + 6 * 0.2 + 5.0
    free = Costs(f_s=(1,), b_s=(2,), i_s=(1,), w_s=(1,), step_end_s=5.0)
    assert simulate(schedule, free).step_s == pytest.approx(base.step_s + 5.0)
    for rt in timeline.ranks:
        assert rt.busy_s == pytest.approx(8 * 3 + 5.0)
        assert all(b.end_s <= rt.last_end_s or b.start_s >= rt.last_end_s + 5.0 for b in rt.bubbles)


def test_costs_from_profile() -> None:
    profile: dict[str, Any] = {
        "version": 1,
        "device_bytes": 80 * GiB,
        "p2p": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e10},
        "step_end_s": 0.02,
        "stages": [
            {
                "stage_idx": 0,
                "median_s": {"F": 0.01, "B": 0.02},
                "p2p_bytes_per_mb": 1e6,
                "activation_bytes_per_mb": GiB,
                "static_bytes": 10 * GiB,
            },
            {
                "stage_idx": 1,
                "median_s": {"F": 0.012, "I": 0.013, "W": 0.011},
                "p2p_bytes_per_mb": 0,
                "activation_bytes_per_mb": GiB,
                "static_bytes": 12 * GiB,
                "input_bytes_per_mb": 1 << 20,
            },
        ],
    }
    costs = Costs.from_profile(profile)
    assert costs.f_s == (0.01, 0.012)
    assert costs.b_s == (0.02, 0.024)
    assert costs.i_s == (0.01, 0.013)  # a full-backward profile splits B evenly
    assert costs.p2p_s(0) == pytest.approx(1e-5 + 1e-4)
    memory = MemoryModel.from_profile(profile)
    assert memory.static_bytes == (10 * GiB, 12 * GiB)
    timeline = simulate(build_schedule("1f1b", ranks=2, microbatches=4), costs, memory)
    assert timeline.step_s > 0.02
    with pytest.raises(ValueError, match=r"stages\[1\]\.median_s needs 'B' or both 'I' and 'W'"):
        Costs.from_profile({"stages": [profile["stages"][0], {"stage_idx": 1, "median_s": {"F": 0.1, "I": 0.1}}]})


def test_analytic_costs_follow_6nt() -> None:
    costs = Costs.analytic(params=40e9, tokens_per_mb=2048, stages=16, device_tflops=1000, mfu=0.5, layers=48)
    f = 2 * 40e9 / 16 * 2048 / 500e12
    assert costs.f_s[0] == pytest.approx(f)
    assert costs.b_s[0] == pytest.approx(2 * f)
    assert costs.i_s[0] == pytest.approx(f) and costs.w_s[0] == pytest.approx(f)
    uneven = Costs.analytic(params=48, tokens_per_mb=1, stages=32, device_tflops=1, layers=48)
    assert uneven.f_s[0] == pytest.approx(2 * uneven.f_s[-1])  # 2 layers on the first 16 stages, 1 on the rest
    with pytest.raises(ValueError, match=r"layers=8 < stages=16"):
        Costs.analytic(params=1e9, tokens_per_mb=1, stages=16, device_tflops=1, layers=8)


def test_fill_projection_uses_the_bubbles_that_fit() -> None:
    timeline = simulate(build_schedule("1f1b", ranks=4, microbatches=8), Costs.uniform())
    profile = FillProfile.from_json(
        {
            "name": "toy",
            "batches": [
                {"batch_size": 1, "step_s": 1.0, "peak_bytes": 0},
                {"batch_size": 4, "step_s": 3.0, "peak_bytes": 0},
            ],
        }
    )
    fill = project_fill(timeline, profile)
    # every 1-unit bubble takes one batch of 1; longer bubbles take batches of 4 (4 samples per 3 units)
    assert 0 < fill.filled_s <= sum(timeline.idle_s(r) for r in range(4))
    assert fill.utilization_gain == pytest.approx(fill.filled_s / (4 * 24))
    assert fill.samples_per_step == sum(p.samples for rank in fill.plans for p in rank)
    assert math.isclose(fill.samples_per_s, fill.samples_per_step / timeline.step_s)
