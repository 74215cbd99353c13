"""The CUDA paths of the trainer and the fill executor, on a real GPU (``pytest -m gpu``; skipped without one).

`pipefill gpu-check --part 1` runs these on a GPU machine. Without CUDA each test is skipped, so they cannot rot
silently: the dry run (`pipefill gpu-check --device cpu`) collects them, and a rename breaks the collection.
What they cover, each a path no CPU run takes: the GPU UUID the trainer publishes selects the same GPU in the fill
executor (and names the GPU NVML knows); the allocator cap holds the fill to its budget; offload moves the fill's
state to pinned host memory and back, unchanged; the trainer's NVML gauges read the device; and one replayed stage
trains in bf16 on the GPU while its fill executor, attached by that UUID and in offload mode, profiles in GPU time
and works inside the announced bubbles.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA0 = torch.device("cuda", 0)


def test_the_uuid_the_trainer_publishes_selects_its_gpu_in_the_fill_and_is_nvmls() -> None:
    import pynvml  # type: ignore[import-untyped]

    from pipefill_fill.device import select_device
    from pipefill_trainer.channel_link import device_uuids

    uuids = device_uuids(CUDA0)
    assert len(uuids) == 1 and uuids[0].startswith("GPU-"), uuids
    assert select_device("cuda", uuids) == CUDA0
    pynvml.nvmlInit()
    try:
        names = {
            pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        }
    finally:
        pynvml.nvmlShutdown()
    assert uuids[0] in {n.decode() if isinstance(n, bytes) else n for n in names}
    with pytest.raises(ValueError, match="not visible to the fill executor"):
        select_device("cuda", ["GPU-00000000-0000-0000-0000-000000000000"])


def test_the_allocator_cap_holds_the_fill_to_its_budget() -> None:
    """In a child process: the cap is process-wide and would stay on this one's other tests."""
    code = """
import torch
from pipefill_fill.device import cap_memory, memory_in_use
dev = torch.device("cuda", 0)
fraction = cap_memory(dev, 1 << 30)
used = memory_in_use(dev)
small = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
assert used() >= 256 << 20, used()
try:
    torch.empty(2 << 30, dtype=torch.uint8, device=dev)
except torch.OutOfMemoryError:
    print("capped", fraction)
else:
    raise SystemExit("2 GiB allocated under a 1 GiB cap")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "capped" in done.stdout, done.stderr[-2000:]


def test_offload_moves_the_state_to_pinned_host_memory_and_back_unchanged() -> None:
    from pipefill_fill.offload import Offloader

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.LayerNorm(512)).to(CUDA0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 512, device=CUDA0)).sum().backward()
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    off = Offloader([model, opt], CUDA0)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(CUDA0)
    assert off.to_host() > 0
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    assert torch.cuda.memory_allocated(CUDA0) < held
    assert off.to_device() > 0
    for p, b in zip(model.parameters(), before, strict=True):
        assert p.device == CUDA0 and torch.equal(p, b)
    opt.zero_grad()
    model(torch.randn(8, 512, device=CUDA0)).sum().backward()
    opt.step()  # the optimizer's state is still keyed by the same parameters


def test_the_trainers_nvml_gauges_read_the_gpu() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from pipefill_trainer.metrics import TrainerMetrics

    registry = CollectorRegistry()
    TrainerMetrics(registry, device_index=0)
    values = {
        line.split()[0]: float(line.split()[1])
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("pipefill_trainer_gpu_")
    }
    assert 0.0 <= values["pipefill_trainer_gpu_utilization_ratio"] <= 1.0, values
    assert values["pipefill_trainer_gpu_memory_total_bytes"] > 1 << 30, values
    assert 0 < values["pipefill_trainer_gpu_memory_used_bytes"] <= values["pipefill_trainer_gpu_memory_total_bytes"]


@pytest.mark.timeout(300)
def test_a_replayed_stage_trains_on_the_gpu_and_its_fill_attached_by_uuid_works_in_its_bubbles(tmp_path: Path) -> None:
    """The whole path of one GPU: ``pipefill bench colocation --device cuda`` in its quick form, offload on."""
    cmd = [
        sys.executable, "-m", "pipefill", "bench", "colocation", "--device", "cuda", "--quick", "--replay-stages", "0",
        "--fill-offload", "--reps", "1", "--warmup-s", "3", "--json", "--keep", str(tmp_path),
        # the quick stage (hidden 128, one block) waits tens of microseconds on a GPU, under the 1 ms announcement
        # floor (H200, session 14: nothing announced, recovery 0): a stage whose waits are milliseconds of kernels
        "--layers-per-stage", "2", "--hidden", "1024", "--heads", "16", "--seq", "512", "--fill-hidden", "256",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(done.stdout)["runs"][0]
    assert run["bubble_recovery"] is not None and run["bubble_recovery"] > 0, run
    assert 0 <= run["gpu_utilization_alone"] <= 1 and 0 <= run["gpu_utilization_fill"] <= 1, run
    sep = run["separate"]
    # the naive runner profiles its job before it runs (seconds on a GPU): in the quick run's few measured steps it
    # may not have started yet, so only the coordinated fill is asked for work here (part 2 measures both)
    assert sep["fill_items_per_s_pipefill"] > 0 and sep["fill_items_per_s_naive"] >= 0, sep
    from pipefill.events import ProfileEvent, read_events

    logs = list(tmp_path.glob("**/pipefill/ranks/0/fill-executor/*.jsonl"))
    assert logs, sorted(str(p) for p in tmp_path.rglob("*.jsonl"))
    profiles = [e for log in logs for e in read_events(log) if isinstance(e, ProfileEvent)]
    assert profiles and all(p.device.startswith("cuda:") for p in profiles), profiles  # profiled in GPU time
