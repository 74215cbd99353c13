"""The closures' pip work for tests/images/test_closures.py: the distribution's wheel, the operator's closure
installed into a fresh venv, and the CUDA closures resolved for the image's platform.

It waits on the package index (70-100 s on CI's machine kind) and computes too (62 CPU seconds on the development VM,
session 31: pip unpacking and installing), so it starts early, in threads, and the tests that run before these hide
its waits; and once a run: under xdist, in pytest's main process (:func:`start_for_workers`, from tests/conftest.py),
which publishes each result to a directory its workers read (:class:`Published`; every worker collects every test,
and each of the two used to start its own); in one process, when its collection ends (tests/images/conftest.py).
Each test still takes its own result, or its own error."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
from dockerfiles import IMAGES, ROOT, context_files, parse

__all__ = ["CUDA", "CUDA_EXTRAS", "LOCK", "PUBLISHED", "Closures", "Published", "Publisher", "pip", "start_for_workers"]

T = TypeVar("T")

LOCK = ROOT / "requirements" / "lock.txt"
CUDA = ROOT / "requirements" / "cuda.txt"
CUDA_EXTRAS = ("trainer", "fill")
_GLIBC_BOOKWORM = 36  # the base image's Debian release ships glibc 2.36
PUBLISHED = "PIPEFILL_TEST_CLOSURES_DIR"  # where xdist's main process publishes the results for its workers
_TEST = Path(__file__).with_name("test_closures.py")


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

    def parts(self) -> dict[str, Future[Any]]:
        """Every result by the name it is published under."""
        return {
            "wheel": self.wheel,
            "operator": self.operator,
            **{f"resolved-{e}": f for e, f in self.resolved.items()},
        }


class Publisher:
    """In xdist's main process: the closures' work, published to ``directory`` for the workers. The main process
    holds the directory's lock exclusively from before the workers start until every result is written, so that a
    worker's shared lock on it waits for them (:class:`Published`); its files stay until the workers have ended."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pipefill-closures-published-"))
        self._lock = open(self.directory / ".lock", "w")  # noqa: SIM115 (held until every result is written)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.closures = Closures()
        self._thread = threading.Thread(target=self._publish, name="closures-publisher", daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        try:
            for name, future in self.closures.parts().items():
                try:
                    value = future.result()
                    data: dict[str, Any] = {"value": str(value) if isinstance(value, Path) else value}
                except BaseException as exc:  # the worker's test fails with it, as it would have failed there
                    data = {"error": "".join(traceback.format_exception(exc))}
                (self.directory / f"{name}.json").write_text(json.dumps(data))
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def close(self) -> None:
        self._thread.join()
        self._lock.close()
        self.closures.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class _Part(Generic[T]):
    def __init__(self, directory: Path, name: str, load: Callable[[Any], T]) -> None:
        self.directory, self.name, self.load = directory, name, load

    def result(self) -> T:
        with open(self.directory / ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # waits while the main process still works (it holds the lock)
        data = json.loads((self.directory / f"{self.name}.json").read_text())
        if "error" in data:
            raise RuntimeError(f"the closures' {self.name} failed in pytest's main process:\n{data['error']}")
        return self.load(data["value"])


class Published:
    """A worker's view of what the main process published: the parts of :class:`Closures`, each ``result()`` its
    value or its error."""

    def __init__(self, directory: Path) -> None:
        self.wheel = _Part(directory, "wheel", Path)
        self.operator = _Part(directory, "operator", Path)
        self.resolved = {extra: _Part(directory, f"resolved-{extra}", list) for extra in CUDA_EXTRAS}


def start_for_workers(config: pytest.Config) -> Publisher | None:
    """In xdist's main process, where the run would collect tests/images/test_closures.py: the closures' work once
    for all workers, its directory in the environment they inherit. None elsewhere, and where ``-k`` or ``-m`` may
    leave the test out (the worker that collects it starts the work then, tests/images/conftest.py)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return None
    if config.option.keyword or config.option.markexpr:
        return None
    base = config.invocation_params.dir
    for arg in config.args:
        path = (base / arg.split("::")[0]).resolve()
        if path == _TEST or path in _TEST.parents:
            publisher = Publisher()
            os.environ[PUBLISHED] = str(publisher.directory)
            return publisher
    return None
