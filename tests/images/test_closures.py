"""The images' Python closures, from the lock's pins, without building an image.

The distribution is built as the Dockerfiles build it: a wheel from exactly the files .dockerignore sends. The
operator's closure is installed for real into a fresh venv, which must import the operator's dependencies and every
core module but not torch. The trainer's and fill's closures are resolved for the image's platform (CPython of the
base image, manylinux x86_64) with ``pip install --dry-run --report``: ``--use-feature=fast-deps`` reads the CUDA
torch wheel's metadata with HTTP range requests instead of downloading 527 MB (PyPI serves no PEP 658 metadata for
torch). Every package of every closure must be pinned: by requirements/lock.txt, requirements/cuda.txt or an exact
(``==``) requirement of another package in the closure. The pip work starts when collection ends
(tests/images/closures.py): each test here waits for its own part.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from closures import CUDA, CUDA_EXTRAS, LOCK, Closures, Published, pip
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

pytestmark = pytest.mark.slow


def _pins(*files: Path) -> dict[str, str]:
    pins = {}
    for path in files:
        for line in path.read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==", 1)
                pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_operator_closure_installs_from_the_lock_and_imports_without_torch(
    closures: Closures | Published, tmp_path: Path
) -> None:
    python = closures.operator.result()
    venv = python.parent.parent

    def run(code: str) -> subprocess.CompletedProcess[str]:
        # -I: only the venv's site-packages, never this checkout (cwd) or the developer's environment
        return subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)

    done = run("import kopf, kubernetes, prometheus_client, pipefill, pipefill_operator; print(pipefill.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(venv)), "imported from the venv, not from the checkout"
    no_torch = run("import torch")
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    core = run(
        "import importlib, pkgutil, pipefill\n"
        "skip = ('pipefill.local', 'pipefill.dashboards')  # the local and dashboards extras, not the operator's\n"
        "for m in pkgutil.walk_packages(pipefill.__path__, 'pipefill.'):\n"
        "    if not m.name.startswith(skip) and not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "import sys; assert 'torch' not in sys.modules and 'grafana_foundation_sdk' not in sys.modules"
    )
    assert core.returncode == 0, core.stderr
    listed = pip("--python", python, "list", "--format", "json").stdout
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed)}
    installed.pop("pipefill-operator")
    pins = _pins(LOCK)
    assert {name: pins.get(name) for name in installed} == installed, "every package at the lock's version"
    assert not any(n.startswith(("torch", "nvidia", "triton", "grafana")) for n in installed)


def _unpinned(install: list[dict[str, Any]], extra: str) -> list[str]:
    """Packages of the closure that neither file nor an exact requirement inside the closure pins."""
    env = {"python_version": "3.12", "platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64"}
    exact = set()
    for item in install:
        metadata = item["metadata"]
        extras = {extra} if metadata["name"] == "pipefill-operator" else set(item.get("requested_extras") or [])
        for text in metadata.get("requires_dist") or []:
            req = Requirement(text)
            applies = req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})
            if applies and any(s.operator == "==" and "*" not in s.version for s in req.specifier):
                exact.add(canonicalize_name(req.name))
    pins = _pins(LOCK, CUDA)
    return [
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in install
        if (name := canonicalize_name(item["metadata"]["name"])) != "pipefill-operator"
        and pins.get(name) != item["metadata"]["version"]
        and name not in exact
    ]


@pytest.mark.parametrize("extra", CUDA_EXTRAS)
def test_the_cuda_closures_resolve_for_the_image_and_are_all_pinned(closures: Closures | Published, extra: str) -> None:
    install = closures.resolved[extra].result()
    got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in install}
    assert got["torch"] == _pins(LOCK)["torch"]
    assert "nvidia-nccl-cu13" in got and "triton" in got, "the CUDA build of torch, not the CPU one"
    assert "nvidia-ml-py" in got, "NVML bindings for the GPU metrics"
    assert "kopf" not in got
    assert ("kubernetes" in got) == (extra == "fill"), "only the fill executor talks to the API server"
    for item in install:  # wheels for the image (CPython 3.12, manylinux x86_64), not for this machine
        tags = parse_wheel_filename(item["download_info"]["url"].rsplit("/", 1)[1])[3]
        assert any(
            (t.interpreter in ("cp312", "py3", "py2") or t.abi == "abi3")
            and (t.platform == "any" or re.fullmatch(r"manylinux[0-9_]*_x86_64", t.platform))
            for t in tags
        ), item["download_info"]["url"]
    assert _unpinned(install, extra) == []
