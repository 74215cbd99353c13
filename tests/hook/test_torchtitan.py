"""torchtitan, unchanged, under the bubble hook: its llama3 debug model with pipeline degree 2 (1F1B and
interleaved) on 2 gloo ranks (CPU-only workarounds in examples/torchtitan/torchtitan_cpu.py, never in the hook).
Per schedule, the same command twice: without the hook, and hooked under ``pipefill local`` with the inference
FillJob of the examples — bubbles simulated from torchtitan's schedule and announced, the FillJob commits work in
them, and the losses torchtitan logs equal the unhooked run's. Small steps (sequence 64) and few (6: the hook
profiles the first steps and the FillJob still commits in the rest) keep it quick, though start-up bound: each
rank's start (torchtitan imports dynamo, inductor and datasets) costs 11 CPU seconds, each step about one (10 steps
took 9 s more). torchtitan 0.2.2 is in the development lock (the ``torchtitan`` extra)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from hook_procs import REPO, Run, run_example, run_local

from pipefill.events import BubbleEvent, read_events

pytestmark = [
    pytest.mark.busy, pytest.mark.slow,  # torchrun and pipefill local: heavy, untimed (tests/sharing.py)
    # looked up, not imported: importing torchtitan (dynamo, inductor, datasets) cost each worker's collection 3 CPU s
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None,
        reason="torchtitan is not installed: pip install 'pipefill-operator[torchtitan]'",
    ),
]  # fmt: skip

SCRIPT = REPO / "examples" / "torchtitan" / "torchtitan_cpu.py"
STEPS = 30
_LOSS = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)*loss:\s*(-?[0-9.]+)")


def test_the_pinned_torchtitan_is_installed() -> None:
    assert importlib.metadata.version("torchtitan") == "0.2.2"


def _losses(outputs: list[str]) -> list[float]:
    """The logged loss of every step, from the rank that has it (the others log -1)."""
    by_step = {int(m[1]): float(m[2]) for out in outputs for m in _LOSS.finditer(out) if float(m[2]) >= 0}
    return [by_step[s] for s in sorted(by_step)]


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_torchtitan_pp2_under_pipefill_local_is_filled_and_computes_the_same(tmp_path: Path, schedule: str) -> None:
    job = yaml.safe_load((REPO / "examples" / "torchtitan-llama3.yaml").read_text())
    args = [*job["spec"]["trainer"]["args"], "--parallelism.pipeline_parallel_schedule", schedule,
            "--training.steps", str(STEPS), "--training.seq_len", "64"]  # fmt: skip
    plain: Run = run_example(
        tmp_path / "plain", [*args, "--job.dump_folder", str(tmp_path / "plain" / "dump")], hook=False, script=SCRIPT,
        timeout_s=110,
    )  # fmt: skip
    job["spec"]["trainer"]["args"] = [*args, "--job.dump_folder", str(tmp_path / "hooked" / "dump")]
    _, out = run_local(tmp_path / "hooked", job, steps=STEPS)  # the FillJob committed work in the bubbles
    logs = [(out / "ranks" / str(r) / "trainer" / "output.log").read_text() for r in (0, 1)]
    assert len(_losses([r.output for r in plain.ranks])) == STEPS
    assert _losses(logs) == _losses([r.output for r in plain.ranks]), "the hook changed what torchtitan computes"
    for rank, log in enumerate(logs):
        assert "bubbles simulated" in log, f"rank {rank}: torchtitan's schedule was not simulated:\n{log[-3000:]}"
        events = read_events(out / "ranks" / str(rank) / "trainer" / "events.jsonl")
        assert any(isinstance(e, BubbleEvent) and e.announced for e in events), f"rank {rank}: nothing announced"
