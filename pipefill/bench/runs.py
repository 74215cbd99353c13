"""What the benchmarks that run child commands share: a root directory for their runs (``--keep DIR``, or a
temporary one removed afterwards), a child command run with its output in a log file, and a failure turned into a
:class:`BenchError` that names what failed, how, and where its output is (with the output's tail, since a temporary
root is gone by the time the error is read).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["BenchError", "failure", "in_root", "log_tail", "run_logged"]

T = TypeVar("T")


class BenchError(RuntimeError):
    """A run that cannot be measured: a child failed or ran past its time, or logged too little to measure."""


def failure(code: int | None, timeout_s: float) -> str:
    """How a child ended, for an error: ``exited N``, or (``code`` None) that it ran past ``--timeout-s``."""
    return f"ran past --timeout-s {timeout_s:g}" if code is None else f"exited {code}"


def log_tail(log: Path, *, chars: int = 3000) -> str:
    """The last ``chars`` characters of a child's output (``(no output)`` where it wrote none)."""
    text = log.read_text(encoding="utf-8", errors="replace")[-chars:] if log.exists() else ""
    return text or "(no output)"


def run_logged(argv: list[str], *, cwd: Path, log: Path, timeout_s: float, what: str) -> None:
    """Run ``argv`` in ``cwd``, its stdout and stderr into ``log``; a :class:`BenchError` naming ``what`` and
    ``log`` if it exits non-zero or runs past ``timeout_s`` (it is killed then)."""
    with log.open("w", encoding="utf-8") as out:
        try:
            code: int | None = subprocess.run(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    if code != 0:
        raise BenchError(f"{what} {failure(code, timeout_s)} (its output: {log}):\n{log_tail(log)}")


def in_root(benchmark: str, keep: Path | None, body: Callable[[Path], T], *, error_json: bool = False) -> T | None:
    """``body(root)`` with ``root`` = ``keep``, or a new temporary directory removed afterwards, whatever happens.

    A :class:`BenchError` from ``body`` is printed — ``pipefill bench BENCHMARK: …`` on stderr, or with
    ``error_json`` the benchmark's JSON ``{"benchmark": …, "error": …}`` on stdout — and gives None (exit 1)."""
    root = keep if keep is not None else Path(tempfile.mkdtemp(prefix=f"pipefill-bench-{benchmark}-"))
    try:
        return body(root)
    except BenchError as exc:
        if error_json:
            print(json.dumps({"benchmark": benchmark, "error": str(exc)}))
        else:
            print(f"pipefill bench {benchmark}: {exc}", file=sys.stderr)
        return None
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
