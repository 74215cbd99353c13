"""Helpers for the trainer's multi-process tests: free ports and launching a gloo world of real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from launched import Proc, popen

from pipefill.ports import free_port

HERE = Path(__file__).parent


def launch(
    argv: Sequence[str], *, world: int, env: dict[str, str] | None = None, cwd: Path | None = None
) -> list[Proc]:
    """Start ``world`` processes of ``python argv…`` with the torch.distributed environment of each rank. A script of
    this folder runs as its module (``-m``), this folder on the import path, so that all of them fork from one
    preloaded launcher (tests/launched.py)."""
    if argv and argv[0].endswith(".py") and Path(argv[0]).parent == HERE:
        argv = ["-m", Path(argv[0]).stem, *argv[1:]]
    port = free_port()
    procs = []
    for rank in range(world):
        proc_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        argv_rank = [sys.executable, *argv]
        procs.append(
            popen(argv_rank, env=proc_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return procs


def wait_all(procs: Sequence[Proc], *, timeout_s: float) -> list[tuple[int, str]]:
    """(exit code, output) of each process; kills the rest when one runs past ``timeout_s``."""
    out = []
    try:
        for proc in procs:
            stdout, _ = proc.communicate(timeout=timeout_s)
            out.append((proc.returncode, stdout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return out
