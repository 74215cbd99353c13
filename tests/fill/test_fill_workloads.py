"""The workload SDK: loading by import path, the builtins' determinism and learning, errors that say what to fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fill_helpers import write_job

from pipefill.spec import load_file
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.workload import load_workload_class


def _task(manifest: Path) -> FillTask:
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    return task


def _run(task: FillTask, batch_size: int) -> None:
    while not task.done():
        task.step(batch_size)
        task.commit()
    task.finish()


def test_user_workload_by_import_path(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "user", builtin=None, import_path="userwork:SquareSums", total=10))
    _run(task, 4)
    rows = read_outputs(task.spec.output_dir)
    assert rows["sample_id"].tolist() == list(range(10))
    assert (task.spec.output_dir / "outputs.npy").exists() and task.finished


@pytest.mark.parametrize(
    ("import_path", "kind", "message"),
    [
        ("userwork:Missing", "inference", "has no class 'Missing'"),
        ("no_such_module_xyz:C", "inference", "cannot import module 'no_such_module_xyz'"),
        ("userwork:NotAWorkload", "inference", "lacks \\['setup', 'state', 'restore', 'done'\\]"),
        ("userwork:SquareSums", "training", "declares kind 'inference'; set kind: inference"),
    ],
)
def test_bad_import_paths_are_explained(import_path: str, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_workload_class(builtin=None, import_path=import_path, kind=kind)


def test_encoder_outputs_do_not_depend_on_batch_size(jobs_dir: Path) -> None:
    params = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16}
    outs = []
    for bs in (1, 5, 16):
        task = _task(write_job(jobs_dir, f"enc{bs}", total=40, parameters=params))
        _run(task, bs)
        outs.append((task.spec.output_dir / "outputs.npy").read_bytes())
    assert outs[0] == outs[1] == outs[2]
    rows = np.load(jobs_dir / "out" / "enc1" / "outputs.npy")
    assert rows["value"].shape == (40, 32) and np.isfinite(rows["value"]).all()


def test_encoder_bad_parameter_names_field(jobs_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"parameters\.hiddenSize: 30 must be divisible by heads \(4\)"):
        _task(write_job(jobs_dir, "bad", parameters={"hiddenSize": 30, "heads": 4}))
    with pytest.raises(ValueError, match=r"parameters\.layers: 'two' must be of type int"):
        _task(write_job(jobs_dir, "bad2", parameters={"layers": "two"}))


def test_train_classifier_learns_checkpoints_and_final_model(jobs_dir: Path) -> None:
    params = {"features": 8, "hidden": 32, "classes": 3, "batchSize": 32, "checkpointEverySteps": 20}
    manifest = write_job(jobs_dir, "clf", builtin="train-classifier", kind="training", total=60, parameters=params)
    task = _task(manifest)
    commits = []
    while not task.done():
        task.step(32)
        if task.commit_due():
            task.commit()
            commits.append(task.committed)
    task.finish()
    assert commits == [20, 40, 60]
    out = task.spec.output_dir
    assert (out / "model.pt").exists() and (out / "checkpoints" / "state-000000000060.pt").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 60 and metrics["accuracy"] > 0.6  # 3 classes: chance is 1/3


def test_task_spec_from_manifest_resolves_relative_paths(jobs_dir: Path, tmp_path: Path) -> None:
    (job,) = load_file(write_job(jobs_dir, "rel", output=Path("relative/out")))
    spec = TaskSpec.from_spec(job, base_dir=tmp_path)  # type: ignore[arg-type]
    assert spec.output_dir == tmp_path / "relative" / "out" and spec.total == 64 and not spec.counts_steps
    assert dataclasses.replace(spec, name="x").workload_id == spec.workload_id
