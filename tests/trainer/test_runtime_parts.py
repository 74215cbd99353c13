"""The rank runtime's parts in isolation: profiling returns a prediction (nothing is mutated), and replay is a peers
implementation — modeled stage costs, the data of peers released when the timeline says."""

from __future__ import annotations

import time

import pytest
import torch

from pipefill.schedules import Costs, build_schedule, simulate
from pipefill_trainer.comm import ReplayTransport
from pipefill_trainer.model import GPTConfig
from pipefill_trainer.peers import ReplayPeers
from pipefill_trainer.profile import StageProfile, predict
from pipefill_trainer.provider import GPTProvider

MODEL = GPTProvider(GPTConfig(layers=4, hidden=32, heads=2, seq_len=16, vocab_size=64))
OWN = {1: StageProfile(median_s={"F": 0.004, "B": 0.008}, static_bytes=1 << 20, p2p_bytes_per_mb=4096, layers=1)}


def test_replay_models_every_stage_and_the_prediction_matches_the_simulator() -> None:
    peers = ReplayPeers(torch.device("cpu"), model=MODEL, microbatch_size=2)
    schedule = build_schedule("1f1b", ranks=4, microbatches=4)
    stages = peers.stage_profiles(OWN, pipeline_ranks=[0, 1, 2, 3], layers_per_stage=[1, 1, 1, 1])
    assert sorted(stages) == [0, 1, 2, 3] and stages[1] == OWN[1]  # this rank's stage kept as measured
    assert all(stages[s].median_s["F"] > 0 and stages[s].layers == 1 for s in (0, 2, 3))  # the others modeled
    prediction = predict(schedule, 1, stages, replay=peers.replay)
    assert prediction.profile["replay"] is True and prediction.profile["schedule"] == "1f1b"
    expected = simulate(schedule, Costs.from_profile(prediction.profile))
    assert prediction.timeline.step_s == pytest.approx(expected.step_s)
    assert {i: s.kind for i, s in prediction.slots.items()} == {
        b.before_action_idx: b.kind for b in expected.bubbles(1)
    }
    assert all(s.predicted_s > 0 for s in prediction.slots.values())


def test_replay_peers_follow_the_timeline_release_data_and_end_the_step_when_it_says() -> None:
    peers = ReplayPeers(torch.device("cpu"), model=MODEL, microbatch_size=2)
    schedule = build_schedule("gpipe", ranks=2, microbatches=2)
    timeline = simulate(schedule, Costs.uniform(f_s=0.01, i_s=0.01, w_s=0.01))
    transport = peers.open_transport(schedule, peers.topology(1, stages=2, data_parallel=4))
    assert isinstance(transport, ReplayTransport) and peers.topology(1, stages=2, data_parallel=4).data_parallel == 1
    peers.follow(timeline, 1)
    spans = timeline.ranks[1].actions
    assert transport.release_s == {i: spans[i].start_s for i in range(len(spans))} and peers.step_s == timeline.step_s
    start = time.monotonic_ns()
    transport.step_begin(start)
    handle = transport.recv(action_idx=0, shape=(2, 16, 32), dtype=torch.float32, stream=(0, 1))
    handle.wait()
    assert (time.monotonic_ns() - start) / 1e9 >= spans[0].start_s
    assert peers.share(lambda: [2, 2]) == [2, 2] and peers.dead_peers() == []
