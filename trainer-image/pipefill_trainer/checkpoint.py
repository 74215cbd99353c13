"""Per-rank checkpoints, written atomically, and the job-wide pointer to the newest complete one.

Layout under ``spec.checkpoint.path``::

    step-00000020/rank-00000.pt   # one file per rank: write to a temporary name, fsync, rename
    latest                        # "20": written (atomically) by rank 0 after every rank saved step 20

A rank killed mid-write leaves only a temporary file; ``latest`` names only steps every rank finished, so resume
never mixes steps. The state holds the step, the stages' weights, the optimizer, and the RNG states; the data position
is the step (see data.py).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["latest_step", "load_rank", "rng_state", "save_rank", "set_rng_state", "write_latest"]


def _rank_path(root: Path, step: int, rank: int) -> Path:
    return root / f"step-{step:08d}" / f"rank-{rank:05d}.pt"


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_rank(root: Path, *, step: int, rank: int, state: dict[str, Any]) -> Path:
    path = _rank_path(root, step, rank)
    _atomic_write(path, lambda fh: torch.save({"step": step, **state}, fh))
    return path


def write_latest(root: Path, step: int) -> None:
    """Mark ``step`` complete; call after every rank saved it (after a barrier)."""
    _atomic_write(root / "latest", lambda fh: fh.write(f"{step}\n".encode()))


def latest_step(root: Path) -> int | None:
    try:
        text = (root / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise ValueError(f"{root / 'latest'} holds {text!r}, not a step number; remove it to start over")
    return int(text)


def load_rank(root: Path, *, step: int, rank: int, map_location: torch.device) -> dict[str, Any]:
    path = _rank_path(root, step, rank)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path} is missing though {root / 'latest'} names step {step}; the job's ranks changed? "
            "start with the same stages × dataParallel, or remove the checkpoint directory"
        )
    state: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=False)
    return state


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
