"""A FillJob's code from a ConfigMap on a real API server, read as the fill executor reads it: with the credentials of
the fill ServiceAccount and only the Role ``pipefill.children.fill_rbac`` gives it (a missing verb would be a 403 that
fails this test), in the FillJob's namespace; a ConfigMap that is missing, or in a namespace the Role does not cover,
fails the job with the reason and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fill_helpers import subprocess_env
from usercode_helpers import write_code

from pipefill import env
from pipefill.children import fill_account_name, fill_rbac
from pipefill.devcluster import ControlPlane
from pipefill.spec import PipelineTrainingJob, load_file

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]

# What the executor does at job start, in a process of its own (the client's configuration is process-wide).
LOAD = """
import json, sys
from pipefill.spec import parse
from pipefill_fill.usercode import load_job_workload
from pipefill_fill.work import TaskSpec
try:
    cls = load_job_workload(TaskSpec.from_spec(parse(json.loads(sys.argv[1]))))
    print(json.dumps({"module": cls.__module__, "name": cls.__name__}))
except ValueError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _config_map(namespace: str, name: str, data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def _load(kubeconfig: Path, namespace: str, config_map: str) -> dict[str, str]:
    fill_job = {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": "scaled", "namespace": namespace},
        "spec": {
            "workload": {"kind": "inference", "importPath": "embed:Scaled", "code": {"configMap": config_map}},
            "output": {"path": "out/scaled"},
            "totalSamples": 10,
        },
    }
    child_env = subprocess_env(**{env.WORK_SOURCE: "kubernetes", "KUBECONFIG": str(kubeconfig)})
    done = subprocess.run(
        [sys.executable, "-c", LOAD, json.dumps(fill_job)], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_code_from_a_config_map_through_the_api_with_the_fill_role(
    control_plane: ControlPlane, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    (job,) = [m for m in load_file(ROOT / "examples" / "cpu-demo.yaml") if isinstance(m, PipelineTrainingJob)]
    code = write_code(tmp_path / "src")
    data = {p.name: p.read_text() for p in code.glob("*.py")}
    control_plane.apply(
        [
            *fill_rbac(namespace=namespace),
            _config_map(namespace, "scaled-code", data),
            _config_map(other_namespace, "scaled-code", data),
        ]
    )
    kubeconfig = control_plane.kubeconfig_for(namespace, fill_account_name(job))

    loaded = _load(kubeconfig, namespace, "scaled-code")
    assert loaded.get("name") == "Scaled" and loaded["module"].startswith("_pipefill_code_"), loaded

    missing = _load(kubeconfig, namespace, "no-such-code")["error"]
    assert missing.startswith(f"FillJob scaled: spec.workload.code.configMap: ConfigMap {namespace}/no-such-code")
    assert "(404 Not Found); create it" in missing

    forbidden = _load(kubeconfig, other_namespace, "scaled-code")["error"]
    assert f"ConfigMap {other_namespace}/scaled-code cannot be read (403 Forbidden)" in forbidden
    assert "may not get ConfigMaps" in forbidden
