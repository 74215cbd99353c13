"""The bubble channel: how a trainer tells the fill executor beside it, on the same GPU, when its device is idle.

One file in a memory-backed directory both containers mount (``$PIPEFILL_CHANNEL_DIR``, default ``/run/pipefill``),
with a fixed, versioned byte layout (``docs/channel.md``) so that other training engines can write the producer side.
The trainer is the :class:`Producer` and never waits for the fill; the fill executor is the :class:`Consumer`::

    with Producer.create(job_name="llm", rank=3, stage_idx=3, num_stages=4) as ch:
        bid = ch.open_bubble(expected_duration_s=0.012, free_bytes=8 << 30, kind=BubbleKind.STEADY, step=7, mb_idx=2)
        ...  # block on the pipeline peer
        ch.close_bubble(bid)

    with Consumer.attach(timeout_s=60) as ch:
        while (b := ch.wait_bubble(timeout_s=1.0)) is not None or ch.trainer_alive():
            if b is not None:
                ...  # run chunks while ch.is_open(b.id) and ch.remaining_s() > chunk_s
                ch.acknowledge(b.id, used_s=..., overrun_s=..., work=...)
"""

from pipefill.channel._files import DEFAULT_CHANNEL_DIR, HOLD_FILE, hold_fill
from pipefill.channel.consumer import Consumer
from pipefill.channel.errors import (
    ChannelBusyError,
    ChannelError,
    ChannelLayoutError,
    ChannelNotFoundError,
    ChannelVersionError,
)
from pipefill.channel.layout import LAYOUT_VERSION
from pipefill.channel.model import Bubble, BubbleKind, BubbleRecord, ChannelInfo, FillAnswer, FillState
from pipefill.channel.producer import Producer

__all__ = [
    "DEFAULT_CHANNEL_DIR",
    "HOLD_FILE",
    "LAYOUT_VERSION",
    "Bubble",
    "BubbleKind",
    "BubbleRecord",
    "ChannelBusyError",
    "ChannelError",
    "ChannelInfo",
    "ChannelLayoutError",
    "ChannelNotFoundError",
    "ChannelVersionError",
    "Consumer",
    "FillAnswer",
    "FillState",
    "Producer",
    "hold_fill",
]
