"""A Hugging Face model under `pipefill local`: its bubbles are predicted and announced, and a FillJob's work runs in
them (examples/hf-demo.yaml, shortened, with a tiny inference FillJob)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import launched
import pytest
import yaml
from manifests import fill_job

from pipefill.events import BubbleEvent, read_events

pytestmark = [pytest.mark.busy, pytest.mark.slow]  # pipefill local: heavy, untimed (tests/sharing.py)
ROOT = Path(__file__).resolve().parents[2]


def test_the_bubbles_of_a_hugging_face_job_are_announced_and_filled(tmp_path: Path) -> None:
    job = yaml.safe_load((ROOT / "examples" / "hf-demo.yaml").read_text())
    job["spec"]["steps"] = 40
    job["spec"]["checkpoint"] = {"path": str(tmp_path / "ckpt"), "intervalSteps": 0}
    fill = fill_job(
        "embed-tiny", output=str(tmp_path / "fill-out"), parameters={"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16},
        totalSamples=256, hostSelector={"matchLabels": {"pipefill.io/fill-pool": "demo"}},
    )  # fmt: skip
    files = [tmp_path / "job.yaml", tmp_path / "fill.yaml"]
    files[0].write_text(yaml.safe_dump(job))
    files[1].write_text(yaml.safe_dump(fill))
    out = tmp_path / "out"
    args = ["-f", str(files[0]), "-f", str(files[1]), "--out", str(out), "--plain", "--no-timeline",
            "--metrics-port", "0"]  # fmt: skip
    done = launched.run(
        [sys.executable, "-m", "pipefill", "local", *args],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    announced = [e for e in read_events(out / "ranks" / "0" / "trainer" / "events.jsonl") if isinstance(e, BubbleEvent)]
    assert any(e.announced and e.predicted_s > 0 for e in announced), "no bubble of the Hugging Face job announced"
    report = json.loads((out / "report.json").read_text())
    assert report["fill_jobs"]["embed-tiny"]["committed"] > 0, report["fill_jobs"]  # work ran in those bubbles
    assert report["fill_busy_s"] > 0
