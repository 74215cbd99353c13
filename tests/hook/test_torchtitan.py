"""torchtitan, unchanged, under the bubble hook: its llama3 debug model with pipeline degree 2 (1F1B and
interleaved) on 2 gloo ranks (CPU-only workarounds in examples/torchtitan/torchtitan_cpu.py, never in the hook):
bubbles are simulated from its schedule, announced and received, and the losses equal the unhooked run's; under
``pipefill local`` a FillJob works in its bubbles. Needs torchtitan 0.2.2 (the ``torchtitan`` extra)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import yaml
from hook_procs import REPO, Run, run_example, run_local

pytest.importorskip("torchtitan", reason="torchtitan is not installed: pip install 'pipefill-operator[torchtitan]'")
pytestmark = pytest.mark.slow

SCRIPT = REPO / "examples" / "torchtitan" / "torchtitan_cpu.py"
CONFIG = "examples/torchtitan/llama3-debug-pp.toml"
STEPS = 8
_LOSS = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)*loss:\s*(-?[0-9.]+)")


def test_the_pinned_torchtitan_is_installed() -> None:
    assert importlib.metadata.version("torchtitan") == "0.2.2"


def _losses(run: Run) -> list[float]:
    """The logged loss of every step, from the rank that has it (the others log -1)."""
    by_step = {int(m[1]): float(m[2]) for r in run.ranks for m in _LOSS.finditer(r.output) if float(m[2]) >= 0}
    return [by_step[s] for s in sorted(by_step)]


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_torchtitan_pp2_is_announced_and_computes_the_same(tmp_path: Path, schedule: str) -> None:
    def args(where: str) -> list[str]:
        return [
            "--job.config_file", CONFIG, "--parallelism.pipeline_parallel_schedule", schedule,
            "--training.steps", str(STEPS), "--job.dump_folder", str(tmp_path / where / "dump"),
        ]  # fmt: skip

    plain = run_example(tmp_path / "plain", args("plain"), hook=False, script=SCRIPT, timeout_s=110)
    hooked = run_example(tmp_path / "hooked", args("hooked"), hook=True, script=SCRIPT, timeout_s=110)
    assert len(_losses(plain)) == STEPS
    assert _losses(hooked) == _losses(plain), "the hook changed what torchtitan computes"
    for rank, r in enumerate(hooked.ranks):
        assert "bubbles simulated" in r.output, f"rank {rank}:\n{r.output[-3000:]}"
        assert [b for b in r.bubbles() if b.announced], f"rank {rank}: no bubble announced"
        assert r.received, f"rank {rank}: the consumer received no bubble"


def test_torchtitan_under_pipefill_local_with_a_filljob(tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "torchtitan-llama3.yaml").read_text())
    job["spec"]["trainer"]["args"] += ["--training.steps", "16", "--job.dump_folder", str(tmp_path / "dump")]
    run_local(tmp_path, job, steps=16)
