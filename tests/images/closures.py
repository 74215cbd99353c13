"""The closures' pip work for tests/images/test_closures.py: the distribution's wheel, the operator's closure
installed into a fresh venv, and the CUDA closures resolved for the image's platform.

All of it waits on the package index far more than it computes (70-100 s on CI's machine kind, a few CPU seconds),
so tests/images/conftest.py starts it in threads as soon as the session's collection ends, and the tests that run
before these (tests/bench ... tests/hook, several minutes of CPU-bound work) hide its waits. Each test still takes
its own result, or its own error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dockerfiles import IMAGES, ROOT, context_files, parse

__all__ = ["CUDA", "CUDA_EXTRAS", "LOCK", "Closures", "pip"]

T = TypeVar("T")

LOCK = ROOT / "requirements" / "lock.txt"
CUDA = ROOT / "requirements" / "cuda.txt"
CUDA_EXTRAS = ("trainer", "fill")
_GLIBC_BOOKWORM = 36  # the base image's Debian release ships glibc 2.36


def pip(*args: str | Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *map(str, args)], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"pip {' '.join(map(str, args))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build_wheel(tmp: Path) -> Path:
    """The distribution's wheel, built as the Dockerfiles' build stage builds it: from a copy of the build context,
    in a fresh venv holding only setuptools from the lock, without build isolation."""
    context = tmp / "src"
    for path in context_files():
        target = context / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    build = tmp / "build"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", build], check=True)
    python = build / "bin" / "python"
    pip("--python", python, "install", "-q", "-c", context / "requirements" / "lock.txt", "setuptools")
    pip("--python", python, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "w", context)
    (built,) = (tmp / "w").glob("pipefill_operator-*.whl")
    return built


def install_operator(wheel: Path, tmp: Path) -> Path:
    """A fresh venv with the operator's closure installed from the lock; its python."""
    venv = tmp / "operator-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    pip("--python", python, "install", "-q", "-c", LOCK, f"{wheel}[operator]")
    return python


def resolve(wheel: Path, extra: str, tmp: Path) -> list[dict[str, Any]]:
    """``pip install --dry-run --report`` of ``extra``'s closure for the image's CPython and manylinux x86_64."""
    python = parse(ROOT / IMAGES[extra]).args["PYTHON_IMAGE"].split(":")[1].split("-")[0]  # 3.12.12
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(17, _GLIBC_BOOKWORM + 1)] + ["manylinux2014_x86_64"]
    report = tmp / f"{extra}.json"
    pip(
        "install", "--dry-run", "--quiet", "--ignore-installed", "--report", report,
        "--use-feature=fast-deps", "--only-binary=:all:",
        *[arg for p in platforms for arg in ("--platform", p)],
        "--python-version", ".".join(python.split(".")[:2]),
        "-c", LOCK, "-c", CUDA, f"{wheel}[{extra}]",
    )  # fmt: skip
    install: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return install


@dataclass
class Closures:
    """The pip work, started in threads: ``wheel``, ``operator`` (the installed venv's python) and ``resolved`` (per
    CUDA extra) resolve to their result or raise their error. ``close`` waits for what runs and removes the files."""

    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pipefill-closures-")))
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1 + 1 + len(CUDA_EXTRAS)))
    wheel: Future[Path] = field(init=False)
    operator: Future[Path] = field(init=False)
    resolved: dict[str, Future[list[dict[str, Any]]]] = field(init=False)

    def __post_init__(self) -> None:
        self.wheel = self.pool.submit(build_wheel, self.tmp)
        self.operator = self.pool.submit(self._after_wheel, install_operator)
        self.resolved = {extra: self.pool.submit(self._after_wheel, resolve, extra) for extra in CUDA_EXTRAS}

    def _after_wheel(self, work: Callable[..., T], *args: str) -> T:
        return work(self.wheel.result(), *args, self.tmp)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
