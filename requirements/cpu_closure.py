"""The requirements of a CPU image (``make images TORCH=cpu``), one per line: what the installed pipefill-operator's
extras and torch ask for, less torch itself and the CUDA packages that a run on the CPU never loads.

PyPI has no CPU build of torch for Linux x86_64 (that one lives on PyTorch's own index, which these machines do not
reach); PyPI's build links the CUDA runtime libraries and loads them at import, even on a CPU (libtorch_cpu.so
needs libcudart and libcupti, libtorch_cuda.so cuBLAS, cuDNN, NCCL, cuFFT, ...: without them ``import torch``
fails). What nothing links and a CPU run never opens is left out: Triton (the GPU compiler, 0.7 GB), cuSOLVER
(opened by CUDA linear algebra alone), NVTX and the CUDA Python bindings (:data:`CPU_UNUSED`).

Run by the image's own Python in the Dockerfiles' build stage, after ``pip install --no-deps torch <the wheel>``:
``python requirements/cpu_closure.py trainer,huggingface,data > cpu.txt``, then ``pip install -c lock.txt -c
cuda.txt -r cpu.txt``. Standard library and pip's vendored ``packaging`` only (nothing else is installed yet).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, requires

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

CPU_UNUSED = frozenset({"triton", "cuda-bindings", "cuda-pathfinder"})
"""torch's own requirements that a CPU image leaves out"""
CUDA_TOOLKIT_UNUSED = frozenset({"cusolver", "nvtx"})
"""extras of torch's ``cuda-toolkit[...]`` requirement (one NVIDIA wheel each) that a CPU image leaves out"""


def cpu_requirements(extras: set[str]) -> list[str]:
    """The requirements of pipefill-operator with ``extras`` and of torch, markers evaluated here, minus torch and
    what a CPU run never loads; sorted, without repeats."""
    out = set()
    for dist, wanted in (("pipefill-operator", extras), ("torch", set())):
        try:
            texts = requires(dist) or []
        except PackageNotFoundError:
            raise SystemExit(f"cpu_closure.py: {dist} is not installed: pip install --no-deps it first") from None
        for text in texts:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue
            name = canonicalize_name(req.name)
            if name == "torch" or (dist == "torch" and name in CPU_UNUSED):
                continue
            if dist == "torch" and name == "cuda-toolkit":
                req.extras = set(req.extras) - CUDA_TOOLKIT_UNUSED
            req.marker = None
            out.add(str(req))
    return sorted(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: cpu_closure.py EXTRA[,EXTRA...]  (e.g. trainer,huggingface,data)", file=sys.stderr)
        return 2
    print("\n".join(cpu_requirements({e.strip() for e in argv[0].split(",") if e.strip()})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
