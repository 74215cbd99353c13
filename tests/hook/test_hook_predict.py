"""The hook's prediction without processes: the schedule as the ranks ran it, simulated, or — when the orders do not
hold together — no slots (every wait is then learned by the announcer)."""

from __future__ import annotations

from pipefill.schedules.costs import Costs
from pipefill.schedules.generators import build_schedule
from pipefill.schedules.model import Action, Kind
from pipefill.schedules.simulate import simulate
from pipefill_hook.predict import predict_slots, schedule_as_ran
from pipefill_trainer.instrument import BubbleAnnouncer

MEDIANS = {0: {"F": 0.010, "B": 0.020}, 1: {"F": 0.012, "B": 0.024}}


def test_the_orders_as_ran_are_the_schedule_and_its_bubbles_the_simulators() -> None:
    built = build_schedule("1f1b", ranks=2, microbatches=4)
    ran = schedule_as_ran({r: list(a) for r, a in enumerate(built.ranks)}, "Schedule1F1B")
    assert ran is not None and ran.ranks == built.ranks and ran.placement == built.placement
    for rank in (0, 1):
        got = predict_slots(ran, rank, MEDIANS)
        assert got.mode == "simulated"
        costs = Costs(f_s=(0.010, 0.012), b_s=(0.020, 0.024), i_s=(0.010, 0.012), w_s=(0.010, 0.012))
        expected = simulate(built, costs).bubbles(rank)
        assert sorted(got.slots) == [b.before_action_idx for b in expected]
        assert [round(got.slots[b.before_action_idx].predicted_s, 9) for b in expected] == [
            round(b.duration_s, 9) for b in expected
        ]


def test_orders_that_do_not_hold_together_leave_every_wait_to_be_learned() -> None:
    f, b = Kind.F, Kind.B
    missing_mb = {0: [Action(0, f, 0), Action(0, b, 0)], 1: [Action(1, f, 1), Action(1, b, 1)]}
    one_stage_two_ranks = {0: [Action(0, f, 0), Action(0, b, 0)], 1: [Action(0, f, 0), Action(0, b, 0)]}
    for orders in (missing_mb, one_stage_two_ranks, {1: [Action(1, f, 0)]}):
        assert schedule_as_ran(orders, "x") is None
    got = predict_slots(None, 0, MEDIANS)
    assert (got.mode, got.slots) == ("learned", {})
    ran = schedule_as_ran(
        {r: list(a) for r, a in enumerate(build_schedule("gpipe", ranks=2, microbatches=2).ranks)}, "g"
    )
    assert predict_slots(ran, 0, {0: MEDIANS[0]}).mode == "learned", "a stage without costs"
    # learned: the announcer makes a slot of each wait it measured, predicted by its history from then on
    announcer = BubbleAnnouncer(actions=[Action(0, f, 0)], slots={}, producer=None, min_bubble_s=0.0,
                                free_bytes=lambda: 0)  # fmt: skip
    announcer.begin_step(0)
    announcer.wait_begin(0)
    announcer.wait_end(0)
    announcer.end_step()
    assert list(announcer.slots) == [0]
