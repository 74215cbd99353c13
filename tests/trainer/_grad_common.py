"""Shared by the gradient-equivalence test and its worker: the tiny model and the deterministic batch."""

from __future__ import annotations

from typing import Any

import torch

from pipefill_trainer.model import GPTConfig


def model_config(c: dict[str, Any]) -> GPTConfig:
    return GPTConfig(
        layers=c.get("layers", 8),
        hidden=32,
        heads=2,
        seq_len=16,
        vocab_size=64,
        tied_embeddings=c.get("tied", False),
        activation_checkpointing=c.get("ckpt", False),
        seed=7,
    )


def batch(c: dict[str, Any], *, dp_rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Microbatches (tokens, targets) of replica ``dp_rank``: each (mb, 16)."""
    m, mb, dp = c["m"], c["mb"], c.get("dp", 1)
    data = torch.randint(0, 64, (dp * m * mb, 17), generator=torch.Generator().manual_seed(123))
    rows = data[dp_rank * m * mb : (dp_rank + 1) * m * mb]
    return [rows[i * mb : (i + 1) * mb, :-1] for i in range(m)], [rows[i * mb : (i + 1) * mb, 1:] for i in range(m)]
