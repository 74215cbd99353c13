"""What a wait point means on the device (``pipefill_trainer.devsync``).

On CPU: the strategy chosen per device, the polling loop against real completions (a ``torch.futures.Future`` set by
another thread; a gloo all-reduce between two processes), and that polling leaves the core mostly idle. The CPU
strategy is exercised end to end by every multi-process trainer test. The CUDA-only parts (events on the compute
stream) are at the end, marked ``gpu``: they run only where a GPU is present.
"""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest
import torch
from trainer_procs import HERE, launch, wait_all

from pipefill_trainer.devsync import BlockingSync, CudaSync, device_sync, poll_until

CUDA = torch.device("cuda")


def _completed_later(delay_s: float, value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    timer = threading.Timer(delay_s, fut.set_result, args=(value,))
    timer.daemon = True
    timer.start()
    return fut


def test_the_strategy_follows_the_device_and_cuda_builds_without_touching_cuda() -> None:
    assert isinstance(device_sync(torch.device("cpu")), BlockingSync)
    assert isinstance(device_sync(torch.device("cuda:0")), CudaSync)  # constructible on a CPU-only build
    with pytest.raises(ValueError, match="cpu or cuda"):
        device_sync(torch.device("meta"))
    with pytest.raises(ValueError, match="cuda device"):
        CudaSync(torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present: the use would succeed")
def test_cuda_sync_used_without_cuda_fails_loudly() -> None:
    sync = CudaSync(CUDA)
    with pytest.raises(RuntimeError, match="without CUDA"):
        sync.drain()
    with pytest.raises(RuntimeError, match="without CUDA"):
        sync.idle_before(torch.futures.Future())


def test_blocking_sync_blocks_in_wait_and_finds_the_cpu_idle_at_a_wait_point() -> None:
    sync = BlockingSync()
    fut = _completed_later(0.05, torch.ones(2))
    assert sync.idle_before(fut)  # compute on the CPU is synchronous: nothing of the rank is left to run
    assert torch.equal(sync.wait(fut), torch.ones(2))
    sync.drain()


def test_polling_returns_once_another_thread_completes_the_receive_and_leaves_the_core_idle() -> None:
    fut = _completed_later(0.3, torch.arange(3.0))
    assert not fut.done()
    wall0_s, cpu0_s = time.monotonic(), time.thread_time()
    got = CudaSync(CUDA).wait(fut)  # polls done(), then wait(): no CUDA call of its own
    wall_s, cpu_s = time.monotonic() - wall0_s, time.thread_time() - cpu0_s
    assert fut.done() and torch.equal(got, torch.arange(3.0))
    assert cpu_s < 0.3 * wall_s, (cpu_s, wall_s)  # sleeps between queries; a spin would use ~all of it


def test_poll_until_checks_first_then_spins_then_sleeps_growing_steps() -> None:
    calls: list[int] = []

    def ready_after(n: int) -> bool:
        calls.append(time.monotonic_ns())
        return len(calls) > n

    poll_until(lambda: ready_after(0))
    assert len(calls) == 1  # ready at once: one query, no sleep
    calls.clear()
    poll_until(lambda: ready_after(200), spin_ns=10**9)  # the spin ends at the first true answer
    assert len(calls) == 201
    calls.clear()
    poll_until(lambda: ready_after(6), spin_ns=0, min_sleep_ns=1_000_000, max_sleep_ns=4_000_000)
    gaps_ns = [b - a for a, b in itertools.pairwise(calls)]
    # sleeps of 1, 2, 4, 4 (, 4) ms between the last queries (a sleep only ever overshoots)
    assert gaps_ns[-1] >= 4_000_000 and sum(gaps_ns) >= 11_000_000, gaps_ns


@pytest.mark.slow
def test_cuda_wait_polls_a_real_gloo_all_reduce_to_completion() -> None:
    procs = launch([str(HERE / "_devsync_worker.py"), "0.5"], world=2)
    results = wait_all(procs, timeout_s=60)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-3000:]}"
    got = json.loads(results[1][1].strip().splitlines()[-1])
    assert got["done_at_once"] is False  # rank 0 joins 0.5 s late
    assert got["x"] == [3.0, 3.0, 3.0]  # returned only once the all-reduce had completed
    assert got["cpu_s"] < 0.3 * got["wall_s"], got


# --- on a GPU only ---------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _queue_gpu_work(seconds_hint: int) -> torch.cuda.Event:
    """Queue matmuls on the current stream (roughly ``seconds_hint`` s on a large GPU); an event after them."""
    a = torch.randn(8192, 8192, device=CUDA)
    for _ in range(40 * seconds_hint):
        a = (a @ a).clamp_(-1, 1)
    done = torch.cuda.Event()
    done.record()
    return done


@pytest.mark.gpu
@gpu
def test_on_cuda_a_wait_point_idles_only_once_the_queued_compute_ran() -> None:
    sync = CudaSync(CUDA)
    compute_done = _queue_gpu_work(1)
    never: torch.futures.Future[None] = torch.futures.Future()
    assert sync.idle_before(never)  # the receive is still pending: a bubble begins …
    assert compute_done.query()  # … only after the GPU ran what the CPU had queued


@pytest.mark.gpu
@gpu
def test_on_cuda_a_receive_completing_before_the_queue_drains_is_no_bubble_and_keeps_the_run_ahead() -> None:
    sync = CudaSync(CUDA)
    compute_done = _queue_gpu_work(2)
    assert not sync.idle_before(_completed_later(0.01, torch.ones(1)))
    assert not compute_done.query()  # the CPU did not wait for the GPU
    sync.drain()
    assert compute_done.query()
