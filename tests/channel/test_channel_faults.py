"""Bad input and faults: foreign, truncated and other-version files, a second owner, a missing directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from waiting import wait_for

from pipefill.channel import (
    ChannelBusyError,
    ChannelLayoutError,
    ChannelNotFoundError,
    ChannelVersionError,
    Consumer,
    Producer,
)
from pipefill.channel import layout as L
from pipefill.channel._files import OwnerLock


def _channel_file(channel_dir: Path, data: bytes) -> Path:
    (channel_dir / "trainer.lock").touch()
    path = channel_dir / "channel"
    path.write_bytes(data)
    return path


def _valid_file_bytes(channel_dir: Path) -> bytes:
    with Producer.create(channel_dir=channel_dir / "src") as p:
        return p.path.read_bytes()


def test_layout_version_mismatch_names_expected_and_found(channel_dir: Path) -> None:
    data = bytearray(_valid_file_bytes(channel_dir))
    L.U32.pack_into(data, L.OFF_VERSION, 3)
    path = _channel_file(channel_dir, bytes(data))
    with pytest.raises(ChannelVersionError) as err:
        Consumer.attach(channel_dir=channel_dir, timeout_s=1)
    assert (err.value.expected, err.value.found) == (1, 3)
    msg = str(err.value)
    assert str(path) in msg and "version 3" in msg and "version 1" in msg and "same PipeFill release" in msg


def test_foreign_file_is_refused_with_the_magic_it_has(channel_dir: Path) -> None:
    _channel_file(channel_dir, b"\x7fELF" + bytes(8188))
    with pytest.raises(ChannelLayoutError, match=r"not a PipeFill bubble channel.*\\x7fELF.*PIPEFILL"):
        Consumer.attach(channel_dir=channel_dir, timeout_s=1)


@pytest.mark.parametrize("keep", [0, 4, 16, 1500, 8191])
def test_truncated_file_is_refused(channel_dir: Path, keep: int) -> None:
    data = _valid_file_bytes(channel_dir)[:keep]
    _channel_file(channel_dir, data)
    with pytest.raises(ChannelLayoutError, match="truncated"):
        Consumer.attach(channel_dir=channel_dir, timeout_s=1)


def test_inconsistent_sizes_are_refused(channel_dir: Path) -> None:
    data = bytearray(_valid_file_bytes(channel_dir))
    L.U32.pack_into(data, L.OFF_RING_CAPACITY, 0)
    _channel_file(channel_dir, bytes(data))
    with pytest.raises(ChannelLayoutError, match="ring_capacity 0"):
        Consumer.attach(channel_dir=channel_dir, timeout_s=1)


def test_a_trainer_replaces_a_foreign_or_old_file(channel_dir: Path) -> None:
    _channel_file(channel_dir, b"garbage")
    with Producer.create(channel_dir=channel_dir) as p:
        assert p.generation == 1
        assert p.path.read_bytes()[:8] == L.MAGIC


def test_second_trainer_on_the_channel_is_refused(channel_dir: Path) -> None:
    with Producer.create(channel_dir=channel_dir, job_name="first"):
        code = (
            "import sys\nfrom pipefill.channel import Producer, ChannelBusyError\n"
            f"try:\n    Producer.create(channel_dir={str(channel_dir)!r})\n"
            "except ChannelBusyError as e:\n    print(e); sys.exit(3)\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode == 3, r.stderr
        assert "held by a live trainer" in r.stdout and f"pid {os.getpid()}" in r.stdout
        with pytest.raises(ChannelBusyError):  # in the same process too (another open file description)
            Producer.create(channel_dir=channel_dir)
    with Producer.create(channel_dir=channel_dir) as p:  # released on close
        assert p.generation == 2


def test_second_fill_executor_is_refused(channel_dir: Path) -> None:
    with (
        Producer.create(channel_dir=channel_dir),
        Consumer.attach(channel_dir=channel_dir, timeout_s=1),
        pytest.raises(ChannelBusyError, match="fill executor"),
    ):
        Consumer.attach(channel_dir=channel_dir, timeout_s=1)


def test_missing_directory_waits_then_names_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFoundError, match=r"nowhere does not exist after waiting 0.3 s.*emptyDir") as err:
        Consumer.attach(channel_dir=missing, timeout_s=0.3)
    assert time.monotonic() - t0 >= 0.3
    assert isinstance(err.value, TimeoutError)


def test_attach_waits_for_a_trainer_that_comes_later(tmp_path: Path) -> None:
    later = tmp_path / "later"
    producers: list[Producer] = []
    threading.Timer(0.2, lambda: producers.append(Producer.create(channel_dir=later))).start()
    with Consumer.attach(channel_dir=later, timeout_s=10) as c:
        assert c.trainer_alive() and c.generation == 1
    producers[0].close()


def test_no_live_trainer_is_a_clear_timeout(channel_dir: Path) -> None:
    Producer.create(channel_dir=channel_dir).close()  # finished
    with pytest.raises(ChannelNotFoundError, match="trainer finished"):
        Consumer.attach(channel_dir=channel_dir, timeout_s=0.2)


def test_environment_variable_names_the_directory(channel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEFILL_CHANNEL_DIR", str(channel_dir))
    with Producer.create() as p, Consumer.attach(timeout_s=1) as c:
        assert p.path == channel_dir / "channel" == Path(c.info().path)


def test_producer_refuses_bad_calls_with_the_rule(channel_dir: Path) -> None:
    with Producer.create(channel_dir=channel_dir) as p:
        with pytest.raises(ValueError, match="'idle' is not a bubble kind"):
            p.open_bubble(expected_duration_s=0.01, free_bytes=0, kind="idle", step=0)
        with pytest.raises(ValueError, match="expected_duration_s=-1"):
            p.open_bubble(expected_duration_s=-1, free_bytes=0, kind="steady", step=0)
        with pytest.raises(ValueError, match="expected_duration_s=nan"):
            p.open_bubble(expected_duration_s=float("nan"), free_bytes=0, kind="steady", step=0)
        with pytest.raises(ValueError, match="free_bytes=-5"):
            p.open_bubble(expected_duration_s=0.01, free_bytes=-5, kind="steady", step=0)
        bid = p.open_bubble(expected_duration_s=0.01, free_bytes=0, kind="steady", step=0)
        with pytest.raises(ValueError, match=f"bubble {bid} is still open"):
            p.open_bubble(expected_duration_s=0.01, free_bytes=0, kind="steady", step=0)
        with pytest.raises(ValueError, match=f"the open bubble is {bid}"):
            p.close_bubble(bid + 1)
        p.close_bubble(bid)
        with pytest.raises(ValueError, match="the open bubble is none"):
            p.close_bubble(bid)
    with pytest.raises(ValueError, match="stage_idx"):
        Producer.create(channel_dir=channel_dir, stage_idx=4, num_stages=4)
    with pytest.raises(ValueError, match="ring_capacity=0"):
        Producer.create(channel_dir=channel_dir, ring_capacity=0)


def test_device_and_identity_reach_the_fill(channel_dir: Path) -> None:
    uuids = ["GPU-5f2c0d1e-aaaa-bbbb-cccc-0123456789ab"]
    with (
        Producer.create(
            channel_dir=channel_dir, job_name="llm-ü", rank=5, stage_idx=1, num_stages=4, gpu_uuids=uuids
        ) as p,
        Consumer.attach(channel_dir=channel_dir, timeout_s=1) as c,
    ):
        info = c.info()
        assert (info.job_name, info.rank, info.stage_idx, info.num_stages, info.gpu_uuids) == (
            "llm-ü",
            5,
            1,
            4,
            tuple(uuids),
        )
        assert info.trainer_pid == info.fill_pid == os.getpid() and info.layout_version == 1
        p.publish_device(gpu_uuids=["GPU-a", "GPU-b"])
        assert c.info().gpu_uuids == ("GPU-a", "GPU-b")


def test_the_fills_floor_reaches_the_trainer_and_a_new_fill_starts_without_one(channel_dir: Path) -> None:
    with Producer.create(channel_dir=channel_dir) as p:
        assert p.fill_floor_s() == 0.0  # no fill yet: no estimate
        with Consumer.attach(channel_dir=channel_dir, timeout_s=1) as c:
            c.publish_floor(0.00125)
            assert p.fill_floor_s() == pytest.approx(0.00125, abs=1e-9)
        # the fill left its floor behind: the next fill's work may need another, so it says none until it knows
        with Consumer.attach(channel_dir=channel_dir, timeout_s=1) as c:
            assert p.fill_floor_s() == 0.0
            c.publish_floor(-1.0)  # clamped: a floor is never negative
            assert p.fill_floor_s() == 0.0


def test_answer_and_history_reach_the_trainer(channel_dir: Path) -> None:
    with (
        Producer.create(channel_dir=channel_dir, ring_capacity=4) as p,
        Consumer.attach(channel_dir=channel_dir, timeout_s=1) as c,
    ):
        for i in range(6):
            bid = p.open_bubble(expected_duration_s=0.5, free_bytes=i, kind="cool-down", step=i, mb_idx=i)
            b = c.wait_bubble(1.0)
            assert b is not None and b.id == bid and 0 < c.remaining_s() <= 0.5
            ans = p.fill_answer()
            assert ans is not None and (ans.bubble_id, ans.state.name) == (bid, "RUNNING")
            p.close_bubble(bid)
            assert not c.is_open(bid) and c.remaining_s() == 0.0
            c.acknowledge(bid, used_s=0.25, overrun_s=0.001, work=3)
        ans = p.fill_answer()
        assert ans is not None and ans.state.name == "YIELDED" and ans.acked_total == 6 and ans.work_total == 18
        hist = p.history()
        assert [r.id for r in hist] == [3, 4, 5, 6] and hist == c.history()
        assert all(r.filled_s == 0.25 and r.overrun_ns == 1_000_000 and r.predicted_s == 0.5 for r in hist)
        with pytest.raises(ValueError, match="must be ≥ 0"):
            c.acknowledge(6, used_s=-1)


def test_a_forked_child_does_not_keep_a_dead_trainer_alive(channel_dir: Path) -> None:
    """The trainer forks a long-lived child (a DataLoader worker) and is killed: its lock must die with it."""
    code = (
        "import os, sys, time\nfrom pipefill.channel import Producer\n"
        f"p = Producer.create(channel_dir={str(channel_dir)!r})\n"
        "child = os.fork()\n"
        "if child == 0:\n    open(os.path.join(sys.argv[1], 'child-up'), 'w').close(); time.sleep(30); os._exit(0)\n"
        "print(child, flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(channel_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        # the child runs Python code: it is past its fork hook
        wait_for((channel_dir / "child-up").exists, "the forked child to start", 10, interval_s=0.01)
        with Consumer.attach(channel_dir=channel_dir, timeout_s=10) as c:
            assert c.trainer_alive()
            proc.kill()
            proc.wait(timeout=10)
            assert not c.trainer_alive(), "the forked child kept the trainer's lock"
        os.kill(child, 9)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_reattaching_to_a_trainer_of_another_release_names_both_versions(channel_dir: Path) -> None:
    p = Producer.create(channel_dir=channel_dir)
    with Consumer.attach(channel_dir=channel_dir, timeout_s=1) as c:
        data = bytearray(p.path.read_bytes())
        p.close()
        L.U32.pack_into(data, L.OFF_VERSION, 2)
        L.U32.pack_into(data, L.OFF_CHANNEL_STATE, L.STATE_READY)
        (channel_dir / ".new").write_bytes(bytes(data))
        os.rename(channel_dir / ".new", channel_dir / "channel")
        lock = OwnerLock(channel_dir / "trainer.lock", create=False)
        lock.acquire(who="trainer", holder="test")
        try:
            with pytest.raises(ChannelVersionError, match="version 2, this code reads version 1"):
                c.trainer_alive()
        finally:
            lock.close()


@pytest.mark.alone  # its spin mode must catch wake-ups on a quiet core: CI caught none beside the other worker
def test_bench_cli_prints_one_json_object_with_the_required_keys() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipefill",
            "bench",
            "channel",
            "--json",
            "--samples",
            "10",
            "--rounds",
            "1",
            "--gap-ms",
            "0.2",
            "--spin-gap-ms",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("wake_us", "open_close_us"):
        assert {"p50", "p99"} <= set(out[key])
    assert out["samples"] == 10 and out["missed"] == {k: 0 for k in out["missed"]}
    spin = out["spin"]
    if os.cpu_count() and len(os.sched_getaffinity(0)) > 1:  # spinning is measured across cores only
        assert {"p50", "p99"} <= set(spin["wake_us_futex"]) and {"p50", "p99"} <= set(spin["wake_us_spin"])
        assert 0 <= spin["caught_share"] <= 1 and spin["spin_cpu_s"] >= 0
    else:
        assert "skipped" in spin
