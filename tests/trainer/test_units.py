"""Fast single-process checks: partition, metrics, data, checkpoint atomicity, announcer slots."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from pipefill import env
from pipefill.schedules.model import Action, Kind
from pipefill.spec.training import Data, DataSource
from pipefill_trainer import checkpoint as ckpt
from pipefill_trainer.config import ConfigError, TrainerConfig
from pipefill_trainer.data import TokenSource, decode, encode
from pipefill_trainer.instrument import BubbleAnnouncer, Slot
from pipefill_trainer.metrics import TrainerMetrics
from pipefill_trainer.model import GPTConfig
from pipefill_trainer.partition import LayerCosts, PartSeconds, measure_parts, partition_layers
from pipefill_trainer.profile import model_peer_medians
from pipefill_trainer.provider import GPTProvider


def test_partition_gives_end_stages_fewer_blocks_when_embedding_and_head_cost() -> None:
    ranges = partition_layers(10, 4, costs=LayerCosts(block=1.0, embed=1.0, head=2.0))
    counts = [len(r) for r in ranges]
    assert sum(counts) == 10 and min(counts) >= 1
    assert max(counts[0] + 1, counts[1], counts[2], counts[3] + 2) == 4  # the optimum: 13 units over 4 stages
    assert counts[3] < max(counts[1], counts[2])
    assert all(a.stop == b.start for a, b in itertools.pairwise(ranges))


def test_partition_override_is_checked() -> None:
    assert [len(r) for r in partition_layers(6, 2, costs=LayerCosts(1, 0, 0), layers_per_stage=[1, 5])] == [1, 5]
    with pytest.raises(ValueError, match="layersPerStage"):
        partition_layers(6, 2, costs=LayerCosts(1, 0, 0), layers_per_stage=[3, 4])


def test_metrics_use_the_given_registry_and_no_gpu_metrics_on_cpu() -> None:
    registry = CollectorRegistry()
    m = TrainerMetrics(registry)
    m.observe_step(step=41, step_s=0.5, tokens=1000, loss=2.5, flops=1e9)
    m.observe_bubble(kind="warm-up", measured_s=0.01, predicted_s=0.012, announced=True)
    assert registry.get_sample_value("pipefill_trainer_loss") == 2.5
    assert registry.get_sample_value("pipefill_trainer_step") == 42  # the job's count, not the process's
    assert registry.get_sample_value("pipefill_trainer_tokens_per_second") == 2000
    assert registry.get_sample_value("pipefill_trainer_bubbles_announced_total", {"kind": "warm-up"}) == 1
    assert registry.get_sample_value("pipefill_trainer_bubble_seconds_total", {"kind": "warm-up"}) == 0.01
    assert registry.get_sample_value("pipefill_trainer_gpu_utilization_ratio") is None


def test_text_and_token_file_data_are_memory_mapped_and_deterministic(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello world, " * 100)
    src = TokenSource(
        Data(source=DataSource.TEXT, path=str(text)), vocab_size=256, seq_len=8, replica_batch=2, replicas=2
    )
    a, b = src.batch(3, dp_rank=1), src.batch(3, dp_rank=1)
    assert torch.equal(a[0], b[0]) and a[0].shape == (2, 8) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    assert decode(encode("héllo")) == "héllo"
    tokens = tmp_path / "tok.bin"
    (torch.arange(1000, dtype=torch.int16) % 50).numpy().astype("uint16").tofile(tokens)
    src = TokenSource(
        Data(source=DataSource.TOKEN_FILE, path=str(tokens)), vocab_size=50, seq_len=8, replica_batch=2, replicas=1
    )
    x, y = src.batch(0, dp_rank=0)
    assert int(x.max()) < 50 and torch.equal((x[:, 1:]), y[:, :-1])


def test_checkpoint_latest_names_only_completed_steps(tmp_path: Path) -> None:
    assert ckpt.latest_step(tmp_path) is None
    ckpt.save_rank(tmp_path, step=4, rank=0, state={"x": 1})
    assert ckpt.latest_step(tmp_path) is None
    ckpt.write_latest(tmp_path, 4)
    assert ckpt.latest_step(tmp_path) == 4
    assert ckpt.load_rank(tmp_path, step=4, rank=0, map_location=torch.device("cpu"))["x"] == 1
    assert not list(tmp_path.rglob("*.tmp-*"))


class _Producer:
    def __init__(self) -> None:
        self.opened: list[tuple[float, str]] = []
        self.closed: list[int] = []

    def open_bubble(self, *, expected_duration_s: float, free_bytes: int, kind: str, step: int, mb_idx: int) -> int:
        self.opened.append((expected_duration_s, kind))
        return len(self.opened)

    def close_bubble(self, bubble_id: int) -> None:
        self.closed.append(bubble_id)

    def fill_floor_s(self) -> float:
        return 0.0


def test_announcer_skips_short_bubbles_and_learns_from_measurements() -> None:
    actions = [Action(0, Kind.F, 0), Action(0, Kind.B, 0)]
    slots = {1: Slot(1, "warm-up", 0.010, 0), 2: Slot(2, "end-of-step", 0.0001, -1)}
    producer = _Producer()
    ann = BubbleAnnouncer(actions=actions, slots=slots, producer=producer, min_bubble_s=0.001, free_bytes=lambda: 7)
    ann.begin_step(5)
    for idx in (1, 2):
        ann.wait_begin(idx)
        ann.wait_end(idx)
    records = ann.end_step()
    assert producer.opened == [(0.010, "warm-up")] and producer.closed == [1]
    assert [r.announced for r in records] == [True, False]
    assert slots[1].predicted_s < 0.010  # moved toward the (near-zero) measured wait


def test_late_remaining_is_a_low_quantile_of_what_long_waits_had_left() -> None:
    slot = Slot(3, "steady", 0.0001, 1)
    for w in (0.0001, 0.0002, 0.006, 0.0001, 0.010):
        slot.learn(w)
    assert slot.late_remaining_s(0.0005) is None  # two long waits so far: no basis yet
    for w in (0.008, 0.012, 0.0001):
        slot.learn(w)
    rest = slot.late_remaining_s(0.0005)  # long waits: 6, 8, 10, 12 ms → 5.5, 7.5, 9.5, 11.5 ms left
    assert rest == pytest.approx(0.0055)


def test_a_wait_announced_late_only_when_it_outlasts_the_threshold() -> None:
    actions = [Action(0, Kind.F, 0), Action(0, Kind.B, 0)]
    slot = Slot(1, "steady", 0.0001, 0)
    for w in (0.004, 0.005, 0.006, 0.007, 0.0001, 0.0001, 0.0001, 0.0002):
        slot.learn(w)
    assert slot.predicted_s < 0.001  # the median of recent waits: short, so the slot is not announced on time
    producer = _Producer()
    ann = BubbleAnnouncer(
        actions=actions,
        slots={1: slot},
        producer=producer,
        min_bubble_s=0.001,
        free_bytes=lambda: 7,
        late_after_s=0.0003,
    )
    ann.begin_step(9)
    ann.wait_begin(1)  # predicted 0.1 ms: not announced on time
    ann.while_waiting(1, lambda: True)  # the input is already there: no announcement
    ann.wait_end(1)
    assert producer.opened == []
    polls = []
    ann.wait_begin(1)
    ann.while_waiting(1, lambda: polls.append(1) is not None)  # never arrives while watched
    records = ann.wait_end(1) or ann.end_step()
    assert len(polls) > 1 and producer.opened == [(pytest.approx(0.0037), "steady")] and producer.closed == [1]
    assert [(r.announced, r.late) for r in records] == [(False, False), (True, True)]
    off = BubbleAnnouncer(actions=actions, slots={1: slot}, producer=producer, min_bubble_s=0.001, free_bytes=lambda: 7)
    off.begin_step(10)
    off.wait_begin(1)
    off.while_waiting(1, lambda: False)
    assert len(producer.opened) == 1  # off by default


def test_replay_models_a_peer_stage_from_its_parts_scaled_by_the_own_stage() -> None:
    # forward: block 2, embed 1, head 10; backward: block 4, embed 1, head 20 (any unit)
    parts = PartSeconds(LayerCosts(block=2.0, embed=1.0, head=10.0), LayerCosts(block=4.0, embed=1.0, head=20.0))
    # own stage 0 (2 blocks + embed) runs 10 % slower than its parts: F 5 -> 5.5, B 9 -> 9.9
    got = model_peer_medians({0: {"F": 5.5, "B": 9.9}}, parts=parts, layers_per_stage=[2, 1, 2])
    assert got[0] == {"F": 5.5, "B": 9.9}
    assert got[1] == pytest.approx({"F": 1.1 * 2, "B": 1.1 * 4})
    assert got[2] == pytest.approx({"F": 1.1 * 14, "B": 1.1 * 28})  # the head makes the last stage the slowest
    # a split backward scales like the full one; two own stages average their ratios
    got = model_peer_medians(
        {0: {"F": 5.0, "I": 4.5, "W": 4.5}, 2: {"F": 28.0, "I": 28.0, "W": 28.0}},
        parts=parts,
        layers_per_stage=[2, 1, 2],
    )
    assert got[1] == pytest.approx({"F": 1.5 * 2, "I": 0.75 * 4, "W": 0.75 * 4})


def test_measured_parts_are_positive_and_a_large_vocabulary_makes_the_head_cost_more() -> None:
    torch.set_num_threads(1)
    small = GPTConfig(layers=1, hidden=32, heads=2, seq_len=16, vocab_size=64, tied_embeddings=False, seed=0)
    parts = measure_parts(GPTProvider(small), mb_size=2, device=torch.device("cpu"), repeats=1)
    assert min(*vars(parts.forward).values(), *vars(parts.backward).values()) > 0
    big = measure_parts(GPTProvider(replace(small, vocab_size=16384)), mb_size=2, device=torch.device("cpu"), repeats=3)
    assert big.forward.head + big.backward.head > 2 * (parts.forward.head + parts.backward.head)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0.0), ("250", 0.00025), ("0", 0.0), ("-1", "within 0..100000"), ("x", "must be an integer")],
)
def test_late_announce_setting(value: str | None, expected: float | str) -> None:
    spec = str(Path(__file__).parents[2] / "examples" / "cpu-demo.yaml")
    environ = {"WORLD_SIZE": "2", env.DEVICE: "cpu"}
    if value is not None:
        environ[env.TRAINER_LATE_ANNOUNCE_US] = value
    if isinstance(expected, float):
        assert TrainerConfig.from_env(environ, spec_path=spec).late_announce_s == pytest.approx(expected)
    else:
        with pytest.raises(ConfigError, match=expected):
            TrainerConfig.from_env(environ, spec_path=spec)
