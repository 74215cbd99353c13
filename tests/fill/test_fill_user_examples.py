"""The user-code examples run (examples/user-code): `pipefill local` with a training job, the example's ConfigMap and
its FillJob (code from the ConfigMap, given with -f), and a FillJob naming the example package's entry point, the
package installed by pip as a fill image built FROM ours would; both jobs' outputs are what the workload computes.
The example Dockerfile passes hadolint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "user-code"
SENTENCES = ROOT / "examples" / "data" / "sentences.txt"
TOTAL = 300


def _expected(lines: list[str]) -> np.ndarray:
    rows = [[len(w := line.split()), len(line), sum(map(len, w)) / max(1, len(w))] for line in lines]
    return np.asarray(rows, dtype=np.float32)


def _fill_job(doc: dict[str, Any], tmp: Path) -> dict[str, Any]:
    doc["spec"]["input"]["path"] = str(SENTENCES)
    doc["spec"]["output"]["path"] = str(tmp / "out" / doc["metadata"]["name"])
    doc["spec"]["totalSamples"] = TOTAL
    return doc


def test_the_dockerfile_example_lints() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("hadolint")), str(EXAMPLE / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)
@pytest.mark.slow
def test_user_code_from_a_config_map_and_an_installed_package_in_pipefill_local(tmp_path: Path) -> None:
    site = tmp_path / "site"  # what `pip install` in the example Dockerfile does, into a directory of its own
    shutil.copytree(EXAMPLE, tmp_path / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site)]
    subprocess.run([*pip, str(tmp_path / "src")], check=True, capture_output=True, timeout=110)
    config_map, from_config_map = yaml.safe_load_all((EXAMPLE / "fill-configmap.yaml").read_text())
    from_package = yaml.safe_load((EXAMPLE / "fill-entrypoint.yaml").read_text())
    manifests = [config_map, _fill_job(from_config_map, tmp_path), _fill_job(from_package, tmp_path)]
    (tmp_path / "fills.yaml").write_text(yaml.safe_dump_all(manifests))
    job = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    # the demo's model as it is: its bubbles (5–15 ms) are what the fill needs; a tinier model's (~1 ms) stay under
    # spec.fill.minBubbleMilliseconds on a quiet machine and nothing is ever announced
    job["spec"]["data"] = {"source": "synthetic"}
    job["spec"]["steps"] = 60
    job["spec"]["checkpoint"] = {"path": str(tmp_path / "ckpt"), "intervalSteps": 20}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "pipefill", "local", "--plain", "--no-timeline", "-f", str(tmp_path / "job.yaml")]
    argv += ["-f", str(tmp_path / "fills.yaml"), "--out", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=110, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = _expected(SENTENCES.read_text(encoding="utf-8").splitlines()[:TOTAL])
    for name in ("word-stats-cm", "word-stats"):
        status = json.loads((tmp_path / "run" / "filljobs" / f"{name}.status.json").read_text())
        assert status["phase"] == "Succeeded", (name, status, done.stdout[-3000:])
        assert status["output"] == {"path": str(tmp_path / "out" / name), "files": ["outputs.npy"]}
        rows = np.load(tmp_path / "out" / name / "outputs.npy")
        assert rows["sample_id"].tolist() == list(range(TOTAL))
        assert np.array_equal(rows["value"], expected)
