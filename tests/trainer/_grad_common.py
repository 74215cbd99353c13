"""Shared by the gradient-equivalence test and its worker: the tiny models and the deterministic batch.

``c["model"]``: ``gpt`` (default, our GPT), ``gpt-3t`` (our GPT sending three tensors between stages, see
:class:`ThreeTensors`), ``llama`` or ``qwen3`` (tiny Hugging Face configs built in code, random init: no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipefill_trainer.model import GPTConfig
from pipefill_trainer.provider import GPTProvider, ModelProvider, TensorMeta, TiedParameter


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


def hf_config(c: dict[str, Any]) -> Any:
    """A tiny Llama (tied embeddings) or Qwen3 (untied, q/k norms) with ``c["layers"]`` decoder layers."""
    from transformers import LlamaConfig, Qwen3Config

    common = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": c.get("layers", 8),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
    }
    if c["model"] == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    return Qwen3Config(**common, head_dim=8, tie_word_embeddings=False)


class _ThreeTensorStage(nn.Module):
    """Our GPT stage that sends (hidden, half the hidden, the token ids) on and mixes all three into its input."""

    def __init__(self, inner: nn.Module, *, first: bool, last: bool) -> None:
        super().__init__()
        self.inner, self.first, self.last = inner, first, last

    def forward(self, *xs: torch.Tensor) -> Any:
        if self.first:
            tokens = xs[0]
            h = self.inner(tokens)
        else:
            h, half, tokens = xs
            h = self.inner(h + half + 0.01 * tokens.unsqueeze(-1).float())  # (B, T, C): wrong ids change it
        return h if self.last else (h, 0.5 * h, tokens)


class ThreeTensors(GPTProvider):
    """A provider whose stages exchange three tensors: two that take a gradient and the int64 token ids, which do not."""

    def build_stage(
        self, *, stage_idx: int, num_stages: int, layers: range, device: torch.device, dtype: torch.dtype | None = None
    ) -> nn.Module:
        inner = super().build_stage(stage_idx=stage_idx, num_stages=num_stages, layers=layers, device=device)
        return _ThreeTensorStage(inner, first=stage_idx == 0, last=stage_idx == num_stages - 1)

    def activations(self, *, stage_idx: int, num_stages: int, mb_size: int) -> tuple[TensorMeta, ...]:
        (hidden,) = super().activations(stage_idx=stage_idx, num_stages=num_stages, mb_size=mb_size)
        return (hidden, hidden, TensorMeta((mb_size, self.cfg.seq_len), torch.int64, grad=False))

    def tied_parameters(self, num_stages: int) -> list[TiedParameter]:
        return [
            TiedParameter({s: f"inner.{name}" for s, name in tie.names.items()})
            for tie in super().tied_parameters(num_stages)
        ]


def provider(c: dict[str, Any]) -> ModelProvider:
    if c.get("model", "gpt") == "gpt":
        return GPTProvider(model_config(c))
    if c["model"] == "gpt-3t":
        return ThreeTensors(model_config(c))
    from pipefill_trainer.hf import HuggingFaceProvider

    return HuggingFaceProvider(hf_config(c), seq_len=16, seed=7, activation_checkpointing=c.get("ckpt", False))
