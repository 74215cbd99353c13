"""``pipefill gpu-check``: the GPU machine's one entry point, kept from rotting while no GPU is here.

Its dry run (``--device cpu``) runs parts 1 and 3 for real at CPU sizes; part 2's run is the colocation benchmark,
whose quick mode tests/bench/test_colocation_smoke.py runs, so here every benchmark command of the GPU plan is parsed
and checked by the benchmark's own option checks, as it would be on the GPU machine. Without CUDA the GPU run stops
at once with the reason and the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipefill.bench import colocation
from pipefill.cli.gpucheck import PARTS, plan


def _gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipefill", "gpu-check", *args], capture_output=True, text=True, timeout=170
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present: the GPU run would start")
def test_without_a_cuda_device_it_stops_at_once_and_says_how_to_go_on(tmp_path: Path) -> None:
    done = _gpu_check("--part", "1", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "torch.cuda.device_count() 0" in done.stderr, done.stderr
    assert "--device cpu" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_part_that_does_not_exist_is_refused_with_the_parts_there_are(tmp_path: Path) -> None:
    done = _gpu_check("--part", "5", "--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 2 and "use 1, 2, 3 or all" in done.stderr


def test_every_benchmark_command_of_the_gpu_plan_passes_the_benchmarks_own_checks(tmp_path: Path) -> None:
    commands = [step.argv for part in PARTS for step in plan(part, "cuda", tmp_path)]
    benches = [argv[argv.index("bench") + 1 :] for argv in commands if "bench" in argv]
    assert {b[0] for b in benches} == {"colocation", "fill", "channel"}
    for argv in (b[1:] for b in benches if b[0] == "colocation"):
        a = colocation._resolve(colocation._parser().parse_args(argv))
        assert a.device == "cuda" and a.replay and a.ranks == [0], argv  # one replayed stage: one GPU
    steps = [s.name for s in plan(3, "cuda", tmp_path)]
    assert steps.index("mps-start") < steps.index("colocation-mps") < steps.index("mps-stop")
    assert next(s for s in plan(3, "cuda", tmp_path) if s.name == "mps-stop").always  # stopped whatever happened


@pytest.mark.busy  # the dry run's benchmarks: heavy, nothing timed is asserted (tests/sharing.py)
@pytest.mark.slow
def test_the_dry_run_runs_parts_1_and_3_and_writes_each_steps_result(tmp_path: Path) -> None:
    done = _gpu_check("--part", "1,3", "--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr + "".join(p.read_text() for p in tmp_path.glob("*.log"))
    part1 = json.loads((tmp_path / "part1.json").read_text())
    facts, pytest_gpu = part1["steps"]
    assert facts["rc"] == 0 and facts["result"]["torch"].startswith(torch.__version__.split("+")[0])
    assert pytest_gpu["rc"] == 0  # every gpu test collected (and skipped here)
    assert "skipped" in (tmp_path / "part1.log").read_text()
    part3 = {s["name"]: s for s in json.loads((tmp_path / "part3.json").read_text())["steps"]}
    assert set(part3) == {"fill-overruns", "channel"}  # no MPS without a GPU
    assert part3["fill-overruns"]["result"]["runs"][0]["bubbles"] > 0
    assert part3["channel"]["result"]["wake_us"]["n"] > 0
