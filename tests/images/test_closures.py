"""The images' Python closures, from the lock's pins, without building an image.

The distribution is built as the Dockerfiles build it: a wheel from exactly the files .dockerignore sends. The
operator's closure is installed for real into a fresh venv, which must import the operator's dependencies and every
core module but not torch. The trainer's and fill's closures are resolved for the image's platform (CPython of the
base image, manylinux x86_64) with ``pip install --dry-run --report``: ``--use-feature=fast-deps`` reads the CUDA
torch wheel's metadata with HTTP range requests instead of downloading 527 MB (PyPI serves no PEP 658 metadata for
torch). Every package of every closure must be pinned: by requirements/lock.txt, requirements/cuda.txt or an exact
(``==``) requirement of another package in the closure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest
from dockerfiles import IMAGES, ROOT, context_files, parse
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

pytestmark = pytest.mark.slow
LOCK = ROOT / "requirements" / "lock.txt"
CUDA = ROOT / "requirements" / "cuda.txt"
_GLIBC_BOOKWORM = 36  # the base image's Debian release ships glibc 2.36


def _pins(*files: Path) -> dict[str, str]:
    pins = {}
    for path in files:
        for line in path.read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==", 1)
                pins[canonicalize_name(name)] = version.strip()
    return pins


def _pip(*args: str | Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *map(str, args)], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"pip {' '.join(map(str, args))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The distribution's wheel, built as the Dockerfiles' build stage builds it: from a copy of the build context,
    in a fresh venv holding only setuptools from the lock, without build isolation."""
    tmp = tmp_path_factory.mktemp("context")
    context = tmp / "src"
    for path in context_files():
        target = context / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    build = tmp / "build"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", build], check=True)
    _pip(
        "--python", build / "bin" / "python", "install", "-q", "-c", context / "requirements" / "lock.txt", "setuptools"
    )
    _pip(
        "--python",
        build / "bin" / "python",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp / "w",
        context,
    )
    (built,) = (tmp / "w").glob("pipefill_operator-*.whl")
    yield built


def test_the_operator_closure_installs_from_the_lock_and_imports_without_torch(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    _pip("--python", python, "install", "-q", "-c", LOCK, f"{wheel}[operator]")

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
    listed = _pip("--python", python, "list", "--format", "json").stdout
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed)}
    installed.pop("pipefill-operator")
    pins = _pins(LOCK)
    assert {name: pins.get(name) for name in installed} == installed, "every package at the lock's version"
    assert not any(n.startswith(("torch", "nvidia", "triton", "grafana")) for n in installed)


def _resolve(wheel: Path, extra: str, tmp: Path) -> list[dict[str, Any]]:
    python = parse(ROOT / IMAGES[extra]).args["PYTHON_IMAGE"].split(":")[1].split("-")[0]  # 3.12.12
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(17, _GLIBC_BOOKWORM + 1)] + ["manylinux2014_x86_64"]
    report = tmp / f"{extra}.json"
    _pip(
        "install", "--dry-run", "--quiet", "--ignore-installed", "--report", report,
        "--use-feature=fast-deps", "--only-binary=:all:",
        *[arg for p in platforms for arg in ("--platform", p)],
        "--python-version", ".".join(python.split(".")[:2]),
        "-c", LOCK, "-c", CUDA, f"{wheel}[{extra}]",
    )  # fmt: skip
    install: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return install


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


_CUDA_EXTRAS = ("trainer", "fill")


@pytest.fixture(scope="module")
def resolved(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[list[dict[str, Any]]]]:
    """Both CUDA closures, resolved at the same time (mostly waiting on the index); each test takes its own result,
    or its own error."""
    tmp = tmp_path_factory.mktemp("resolve")
    with ThreadPoolExecutor(len(_CUDA_EXTRAS)) as pool:
        futures = {extra: pool.submit(_resolve, wheel, extra, tmp) for extra in _CUDA_EXTRAS}
        wait(futures.values())
    return futures


@pytest.mark.parametrize("extra", _CUDA_EXTRAS)
def test_the_cuda_closures_resolve_for_the_image_and_are_all_pinned(
    resolved: dict[str, Future[list[dict[str, Any]]]], extra: str
) -> None:
    install = resolved[extra].result()
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
