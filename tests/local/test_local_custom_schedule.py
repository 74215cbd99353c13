"""`pipefill local` with ``schedule: custom``: the ConfigMap manifest the operator reads on a cluster is given with -f
(the same file ``kubectl apply -f`` takes), its CSV drives the real trainer processes, and a missing ConfigMap or key
or a schedule that cannot run is refused before any process starts, with the field, value, rule and fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import launched
import pytest
import yaml

from pipefill.events import ActionEvent, read_events

pytestmark = pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-schedule" / "custom-demo.yaml"


def _example() -> tuple[dict[str, Any], dict[str, Any]]:
    config_map, job = (d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d)
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PipelineTrainingJob"
    return config_map, job


def _tiny(job: dict[str, Any], tmp: Path, *, steps: int) -> dict[str, Any]:
    job["spec"]["model"] = {"layers": 2, "hiddenSize": 32, "heads": 2, "seqLen": 16, "vocabSize": 256}
    job["spec"]["data"] = {"source": "synthetic"}
    job["spec"]["steps"] = steps
    job["spec"]["checkpoint"] = {"path": str(tmp / "ckpt"), "intervalSteps": 5}
    job["spec"]["fill"]["enabled"] = False
    return job


def _write(path: Path, *docs: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def _local(*args: str) -> subprocess.CompletedProcess[str]:
    return launched.run([sys.executable, "-m", "pipefill", "local", *args], capture_output=True, text=True, timeout=110)


@pytest.mark.slow
def test_the_configmaps_schedule_drives_the_trainers(tmp_path: Path) -> None:
    config_map, job = _example()
    out = tmp_path / "out"
    files = ["-f", _write(tmp_path / "job.yaml", _tiny(job, tmp_path, steps=3)), "-f"]
    files.append(_write(tmp_path / "schedule.yaml", config_map))  # a file of its own, as users keep it
    done = _local(*files, "--out", str(out), "--plain", "--no-timeline", "--metrics-port", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "schedule custom" in done.stdout and "training finished" in done.stdout
    csv = config_map["data"]["schedule.csv"]
    assert (out / "schedule.csv").read_text() == csv  # beside job.yaml, as the spec ConfigMap's mount has it
    for rank, row in enumerate(csv.split()):
        events = read_events(out / "ranks" / str(rank) / "trainer" / "events.jsonl")
        actions = [e for e in events if isinstance(e, ActionEvent)]
        steps = sorted({e.step for e in actions})
        assert len(steps) == 3, steps
        for step in steps:
            order = [e.action for e in sorted(actions, key=lambda e: e.idx) if e.step == step]
            assert order == row.split(","), f"rank {rank} step {step} did not run the CSV's order"


def test_a_job_without_its_configmap_is_refused_naming_the_field_and_the_fix(tmp_path: Path) -> None:
    _, job = _example()
    done = _local("-f", _write(tmp_path / "job.yaml", _tiny(job, tmp_path, steps=3)), "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert "spec.pipeline.customSchedule" in done.stderr and "'custom-demo-schedule'" in done.stderr
    assert "does not exist" in done.stderr and "pass its manifest with -f" in done.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran


DEADLOCK = "0F0,0B0,0F1,0B1,0F2,0B2,0F3,0B3\n1F0,1F1,1B0,1B1,1F2,1F3,1B2,1B3\n"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(  # the key is not there: the keys it has, and both fixes
            {"order.csv": "0F0"},
            ["no key 'schedule.csv' (spec.pipeline.customSchedule.key); its keys: order.csv",
             "set spec.pipeline.customSchedule.key"],
            id="key-missing",
        ),
        pytest.param(  # a CSV that cannot run: refused as the operator refuses it (InvalidSpec), before any process
            {"schedule.csv": DEADLOCK},
            ["custom schedule (ConfigMap 'custom-demo-schedule' key 'schedule.csv'", "deadlock"],
            id="deadlock",
        ),
    ],
)  # fmt: skip
def test_a_configmap_that_cannot_serve_the_job_is_refused(
    tmp_path: Path, data: dict[str, str], expected: list[str]
) -> None:
    config_map, job = _example()
    config_map["data"] = data
    done = _local("-f", _write(tmp_path / "both.yaml", config_map, _tiny(job, tmp_path, steps=3)))
    assert done.returncode == 2
    for text in expected:
        assert text in done.stderr


def test_a_configmap_with_a_bad_key_or_an_unused_one(tmp_path: Path) -> None:
    config_map, job = _example()
    bad = {**config_map, "data": {"../x": "1"}}
    done = _local("-f", _write(tmp_path / "bad.yaml", bad, _tiny(job, tmp_path, steps=3)))
    assert done.returncode == 2 and "data: Invalid value: '../x'" in done.stderr
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}, "data": {}}
    twice = _local("-f", _write(tmp_path / "twice.yaml", config_map, config_map, _tiny(job, tmp_path, steps=3)))
    assert twice.returncode == 2 and "is given twice" in twice.stderr
    from pipefill.local.manifests import load_manifests

    loaded = load_manifests([_write(tmp_path / "extra.yaml", config_map, other, _tiny(job, tmp_path, steps=3))])
    assert loaded.schedule_csv == config_map["data"]["schedule.csv"]
    assert loaded.warnings == [
        f"ConfigMap 'unrelated' ({tmp_path / 'extra.yaml'}) is not used by 'custom-demo' or its FillJobs; it is ignored"
    ]
