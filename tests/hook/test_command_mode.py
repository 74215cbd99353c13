"""spec.trainer (the user's own command): admission's rules, the round trip, the rank pod it renders (init
container, PYTHONPATH, rank environment in the trainer alone, the user's image) and the local processes."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hook_procs import run_local

from pipefill.cli.local import header
from pipefill.events import BubbleEvent, read_events
from pipefill.local.procs import local_processes
from pipefill.pods import rank_containers, rank_pod
from pipefill.spec import PipelineTrainingJob, SpecError, load_file, parse, to_obj
from pipefill.usercommand import HOOK_DIR

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "pipelining" / "pipelining-demo.yaml"
RANK_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES"}


def _demo() -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    return obj


def _job(obj: dict[str, Any]) -> PipelineTrainingJob:
    job = parse(copy.deepcopy(obj))
    assert isinstance(job, PipelineTrainingJob)
    return job


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_demo_needs_no_model_or_pipeline_and_round_trips() -> None:
    (job,) = load_file(DEMO)
    assert isinstance(job, PipelineTrainingJob) and job.spec.trainer is not None
    assert job.world_size == 2 and job.spec.pipeline.stages == 2
    assert 1 in job.spec.run_policy.restart_on_exit_codes, "torchrun's exit 1 restarts the gang by default"
    written = to_obj(job)
    assert "pipeline" not in written["spec"] and "model" not in written["spec"]
    assert to_obj(parse(copy.deepcopy(written))) == written


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda s: s.pop("trainer"), "spec.model and spec.pipeline are required"),
        (lambda s: s.update(model={"preset": "gpt-tiny"}), "remove spec.model and spec.pipeline"),
        (lambda s: s.update(pipeline={"stages": 2, "microbatches": 2, "globalBatch": 4}), "remove spec.model"),
        (lambda s: s["trainer"].pop("command"), "spec.trainer.command"),
    ],
    ids=["neither", "model-beside", "pipeline-beside", "no-command"],
)
def test_admission_refuses_what_command_mode_cannot_mean(change: Any, needle: str) -> None:
    obj = _demo()
    change(obj["spec"])
    with pytest.raises(SpecError) as err:
        parse(obj)
    assert needle in str(err.value)


def test_retry_exit_codes_can_be_emptied() -> None:
    obj = _demo()
    obj["spec"]["trainer"]["retryExitCodes"] = []
    assert _job(obj).spec.run_policy.restart_on_exit_codes == [75, 137, 143]


def test_the_rank_pod_runs_the_users_command_with_the_hook_brought_in() -> None:
    obj = _demo()
    obj["spec"]["trainer"]["image"] = "example.com/my-trainer:1"
    job = _job(obj)
    pod = rank_pod(job, 1, namespace="ns")
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["pipefill-hook", "fill-executor"], "the hook is copied before all else"
    assert init[0]["image"] == job.spec.trainer_image
    assert init[0]["command"] == ["python", "-m", "pipefill_hook.install", HOOK_DIR]
    (trainer,) = pod["spec"]["containers"]
    assert trainer["image"] == "example.com/my-trainer:1"
    assert trainer["command"] == ["python", "examples/pipelining/train.py", *obj["spec"]["trainer"]["args"]]
    env = _env(trainer)
    assert env["PYTHONPATH"] == f"{HOOK_DIR}/boot:{HOOK_DIR}/lib" and env["PIPEFILL_HOOK"] == "1"
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "0"
    assert env["PET_NODE_RANK"] == "1" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "pipelining-demo-0.pipelining-demo"
    assert float(env["PIPEFILL_FILL_MIN_BUBBLE_MS"]) == 1.0
    assert {"name": "pipefill-hook", "mountPath": HOOK_DIR, "readOnly": True} in trainer["volumeMounts"]
    fill = _env(init[1])
    assert not RANK_ENV & set(fill) and "PYTHONPATH" not in fill, "the rank environment is the trainer's alone"
    assert "PYTHONPATH" not in _env(init[0])
    assert {"name": "pipefill-hook", "emptyDir": {"sizeLimit": "256Mi"}} in pod["spec"]["volumes"]


def test_without_the_hook_the_command_runs_as_is() -> None:
    obj = _demo()
    obj["spec"]["trainer"]["hook"] = False
    pod = rank_pod(_job(obj), 0, namespace="ns")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fill-executor"]
    env = _env(pod["spec"]["containers"][0])
    assert "PYTHONPATH" not in env and "PIPEFILL_HOOK" not in env and env["RANK"] == "0"
    assert all(v["name"] != "pipefill-hook" for v in pod["spec"]["volumes"])


def test_our_trainer_is_unchanged() -> None:
    (plan,) = [p for p in rank_containers(load_file(ROOT / "examples" / "cpu-demo.yaml")[0], 0) if p.name == "trainer"]  # type: ignore[arg-type]
    assert plan.argv == ["python", "-m", "pipefill_trainer"] and "LOCAL_RANK" not in plan.env


def test_pipefill_local_names_the_command_not_a_schedule_it_does_not_run(tmp_path: Path) -> None:
    job = _job(_demo())
    line = header(job, device="cpu", out_dir=tmp_path)
    assert "its own command (python)" in line and "schedule" not in line, line
    ours = load_file(ROOT / "examples" / "cpu-demo.yaml")[0]
    assert "schedule 1f1b," in header(ours, device="cpu", out_dir=tmp_path)  # type: ignore[arg-type]


def test_local_processes_run_the_command_with_this_pythons_hook(tmp_path: Path) -> None:
    job = _job(_demo())
    procs = local_processes(
        job, spec_file=tmp_path / "job.yaml", out_dir=tmp_path, work_dir=tmp_path, channel_root=tmp_path / "ch",
        master_port=12345, pin=False,
    )  # fmt: skip
    trainers = [p for p in procs if p.container == "trainer"]
    assert [p.argv for p in trainers] == [[sys.executable, "examples/pipelining/train.py", *job.spec.trainer.args]] * 2  # type: ignore[union-attr]
    for p in trainers:
        assert p.env["MASTER_ADDR"] == p.env["PET_MASTER_ADDR"] == "127.0.0.1" and p.env["PET_MASTER_PORT"] == "12345"
        path = p.env["PYTHONPATH"].split(os.pathsep)
        assert path[0] == str(ROOT / "trainer-image" / "pipefill_hook" / "boot"), path
        assert str(ROOT / "trainer-image") in path


@pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)
@pytest.mark.slow
def test_pipefill_local_runs_the_command_hooked_and_a_filljob_works_in_its_bubbles(tmp_path: Path) -> None:
    obj = _demo()  # the demo's own model and schedule: bubbles of several ms, long enough for the fill
    args = obj["spec"]["trainer"]["args"]
    args[args.index("--steps") + 1] = "60"
    _, out = run_local(tmp_path, obj, steps=60)
    for rank in (0, 1):
        events = read_events(out / "ranks" / str(rank) / "trainer" / "events.jsonl")
        assert any(isinstance(e, BubbleEvent) and e.announced for e in events), f"rank {rank} announced nothing"
        log = (out / "ranks" / str(rank) / "trainer" / "output.log").read_text()
        assert "bubbles simulated" in log, log
