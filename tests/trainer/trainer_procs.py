"""Helpers for the trainer's multi-process tests: free ports and launching a gloo world of real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pipefill.ports import free_port

HERE = Path(__file__).parent


def launch(
    argv: Sequence[str], *, world: int, env: dict[str, str] | None = None, cwd: Path | None = None
) -> list[subprocess.Popen[str]]:
    """Start ``world`` processes of ``python argv…`` with the torch.distributed environment of each rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        proc_env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env=proc_env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def wait_all(procs: Sequence[subprocess.Popen[str]], *, timeout_s: float) -> list[tuple[int, str]]:
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
