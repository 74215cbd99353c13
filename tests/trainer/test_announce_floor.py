"""The announcement floor: the spec's minimum where it sets one, otherwise the one the fill publishes on the channel
(the shortest bubble its work can use), 5 ms while it has published none (#25)."""

from __future__ import annotations

from pathlib import Path

from pipefill.channel import Consumer, Producer
from pipefill.env import AUTO_MIN_BUBBLE_MS
from pipefill.schedules.model import Action, Kind
from pipefill_trainer.instrument import BubbleAnnouncer, Slot


def _announced(ann: BubbleAnnouncer, step: int) -> list[bool]:
    ann.begin_step(step)
    for idx in (1, 2, 3):
        ann.wait_begin(idx)
        ann.wait_end(idx)
    return [r.announced for r in ann.end_step()]


def test_an_unset_minimum_follows_the_fills_floor_on_the_channel(tmp_path: Path) -> None:
    actions = [Action(0, Kind.F, 0), Action(0, Kind.F, 1), Action(0, Kind.B, 0), Action(0, Kind.B, 1)]

    def slots() -> dict[int, Slot]:  # fresh each step: the announcer learns from the (near-zero) measured waits
        return {1: Slot(1, "warm-up", 0.008, 0), 2: Slot(2, "steady", 0.003, 1), 3: Slot(3, "steady", 0.0008, 0)}

    with Producer.create(channel_dir=tmp_path) as producer:
        ann = BubbleAnnouncer(
            actions=actions, slots=slots(), producer=producer, min_bubble_s=None, free_bytes=lambda: 1
        )
        assert ann.floor_s() == AUTO_MIN_BUBBLE_MS / 1e3 and _announced(ann, 1) == [True, False, False]
        with Consumer.attach(channel_dir=tmp_path, timeout_s=5) as fill:
            fill.publish_floor(0.0007)  # e.g. a wake-up, a 0.5 ms guard and a 0.1 ms piece
            ann.slots = slots()
            assert _announced(ann, 2) == [True, True, True]
            fill.publish_floor(0.002)
            ann.slots = slots()
            assert _announced(ann, 3) == [True, True, False]
            # a minimum the spec sets wins over the fill's floor
            explicit = BubbleAnnouncer(
                actions=actions, slots=slots(), producer=producer, min_bubble_s=0.005, free_bytes=lambda: 1
            )
            assert explicit.floor_s() == 0.005 and _announced(explicit, 4) == [True, False, False]
        # the fill went away: the next one starts without a floor, the default holds until it says one
        with Consumer.attach(channel_dir=tmp_path, timeout_s=5):
            ann.slots = slots()
            assert _announced(ann, 5) == [True, False, False]
