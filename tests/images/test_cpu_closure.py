"""The CPU images (``make images TORCH=cpu``): requirements/cpu_closure.py lists what the image's extras and torch need,
without torch and without the CUDA packages a CPU run never loads (Triton, cuSOLVER, NVTX, the CUDA Python bindings);
the Dockerfiles take that path only for TORCH=cpu.

The script reads installed metadata: this venv's torch (PyPI's build, whose requirements name the CUDA wheels) and
pipefill-operator stand in for the image's, which the build stage installs with ``--no-deps`` first.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dockerfiles import IMAGES, ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipefill.devcluster.images import TORCH_BUILDS, build_args

SCRIPT = ROOT / "requirements" / "cpu_closure.py"
EXTRAS = {"trainer": "trainer,huggingface,data", "fill": "fill"}


def _cpu_requirements() -> Callable[[set[str]], list[str]]:
    found: Callable[[set[str]], list[str]] = runpy.run_path(str(SCRIPT))["cpu_requirements"]
    return found


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


@pytest.mark.parametrize("image", EXTRAS)
def test_the_cpu_requirements_leave_out_torch_and_what_a_cpu_run_never_loads(image: str) -> None:
    cpu = {
        canonicalize_name(Requirement(r).name): Requirement(r)
        for r in _cpu_requirements()(set(EXTRAS[image].split(",")))
    }
    assert not {"torch", "triton", "cuda-bindings", "cuda-pathfinder"} & set(cpu)
    # what torch's libraries link, and so load at import even on a CPU (libcudart, libcupti, cuBLAS, cuDNN, NCCL, ...)
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13"} <= set(cpu)
    toolkit = cpu["cuda-toolkit"]
    assert {
        "cudart",
        "cupti",
        "cublas",
        "cufft",
        "curand",
        "cusparse",
        "nvjitlink",
        "nvrtc",
        "cufile",
    } == toolkit.extras
    assert str(toolkit.specifier).startswith("=="), "torch's exact pin, kept"
    assert "nvidia-ml-py" in cpu, "our own NVML bindings stay (they fail cleanly without a GPU)"
    assert {"numpy", "prometheus-client", "sympy", "filelock", "jinja2", "networkx", "fsspec"} <= set(cpu)
    assert ("kubernetes" in cpu) == (image == "fill") and ("transformers" in cpu) == (image == "trainer")
    assert all(r.marker is None for r in cpu.values()), "markers are evaluated by the script, not left to pip"
    pinned = _pins(ROOT / "requirements" / "lock.txt") | _pins(ROOT / "requirements" / "cuda.txt")
    exact = {name for name, r in cpu.items() if str(r.specifier).startswith("==")}
    assert [n for n in cpu if n not in pinned and n not in exact] == [], "pinned as the CUDA images' are"


def test_the_script_says_what_it_needs() -> None:
    usage = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: cpu_closure.py EXTRA" in usage.stderr
    listed = subprocess.run([sys.executable, SCRIPT, "fill"], capture_output=True, text=True, check=True).stdout
    assert "kubernetes>=30" in listed.splitlines()


@pytest.mark.parametrize("image", EXTRAS)
def test_the_dockerfiles_take_the_cpu_path_only_for_torch_cpu(image: str) -> None:
    text = (ROOT / IMAGES[image]).read_text()
    build_stage = text.split(" AS build", 1)[1].split("\nFROM ", 1)[0]
    assert "\nARG TORCH=cuda\n" in build_stage, "the CUDA build stays the default"
    cpu, cuda = build_stage.split('if [ "$TORCH" = cpu ]; then', 1)[1].split("else", 1)
    assert f"requirements/cpu_closure.py {EXTRAS[image]} " in cpu and "--no-deps" in cpu
    assert "-c requirements/cuda.txt -r /tmp/cpu.txt" in cpu and "-c requirements/cuda.txt" in cuda
    assert f"[{EXTRAS[image]}]" in cuda, "the same extras on both paths"
    assert 'case "$TORCH" in cpu|cuda)' in build_stage, "another value fails the build, with the reason"


def test_only_the_trainer_and_fill_images_take_the_torch_argument() -> None:
    base = "pipefill.local/python:3.11-bookworm"
    assert build_args("operator", base=base, torch="cpu") == {"PYTHON_IMAGE": base}
    assert build_args("trainer", base=base, torch="cpu") == {"PYTHON_IMAGE": base, "TORCH": "cpu"}
    assert build_args("fill", base=base, torch="cuda")["TORCH"] == "cuda"
    with pytest.raises(ValueError, match="--torch 'rocm': not a torch build; choose one of cuda, cpu"):
        build_args("fill", base=base, torch="rocm")
    assert TORCH_BUILDS == ("cuda", "cpu")
