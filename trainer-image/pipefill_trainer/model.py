"""A GPT-style decoder cut into pipeline stages; each rank builds only the stages it holds.

A stage is token + position embeddings (first stage only), a contiguous run of pre-norm blocks (causal attention, MLP),
and the final norm + output head (last stage only). Every parameter is initialized from a generator seeded by the
job seed and the parameter's place in the *whole* model (embedding, block ``i``, head), so any partition — and the
single-process reference in the tests — starts from the same weights without building the whole model anywhere.

Linear layers can defer their weight gradient (:class:`WeightGradStore`): the zero-bubble schedules run ``I`` (input
gradient, sent to the previous stage at once) and later ``W`` (weight gradient), exactly the split of Qi et al. 2024.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

__all__ = [
    "DeferrableLinear",
    "GPTConfig",
    "StageModule",
    "WeightGradStore",
    "build_stage",
    "make_deferrable",
    "set_grad_store",
    "undeferred",
]

_SEED_WTE, _SEED_WPE, _SEED_HEAD = 1_000_001, 1_000_002, 1_000_003


@dataclass(frozen=True)
class GPTConfig:
    """Model shape; see ``spec.model``."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab_size: int
    tied_embeddings: bool = False
    activation_checkpointing: bool = False
    """recompute each block's activations in backward (GPipe's re-materialization)"""
    seed: int = 0

    def block_flops_per_token(self) -> float:
        """Forward FLOPs of one block per token: 2·12·h² (matmuls) + 2·2·T·h (attention scores and mix)."""
        return 24.0 * self.hidden**2 + 4.0 * self.seq_len * self.hidden

    def head_flops_per_token(self) -> float:
        return 2.0 * self.hidden * self.vocab_size

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward = 3 × forward), for model TFLOP/s."""
        return 3.0 * (self.layers * self.block_flops_per_token() + self.head_flops_per_token())


class WeightGradStore:
    """Holds (input, output gradient) of deferred linear layers per (stage, microbatch) until ``W`` runs."""

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None  # set while an ``I`` action runs backward
        self._pending: dict[
            tuple[int, int], list[tuple[nn.Parameter, nn.Parameter | None, torch.Tensor, torch.Tensor]]
        ] = {}

    def defer(self, weight: nn.Parameter, bias: nn.Parameter | None, x: torch.Tensor, grad_out: torch.Tensor) -> None:
        assert self.key is not None  # only called from _DeferrableLinear.backward while key is set
        self._pending.setdefault(self.key, []).append((weight, bias, x, grad_out))

    def apply(self, key: tuple[int, int]) -> None:
        """Accumulate the weight gradients deferred under ``key`` (stage_idx, mb_idx)."""
        for weight, bias, x, grad_out in self._pending.pop(key, []):
            x2, g2 = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
            _accumulate(weight, (g2.t() @ x2).to(weight.dtype))
            if bias is not None:
                _accumulate(bias, g2.sum(0).to(bias.dtype))

    def __len__(self) -> int:
        return len(self._pending)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class _DeferrableLinear(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, bias, store):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, weight)
        ctx.store, ctx.weight, ctx.bias = store, weight, bias
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_out):  # type: ignore[no-untyped-def]
        x, weight = ctx.saved_tensors
        grad_in = grad_out @ weight.to(grad_out.dtype) if ctx.needs_input_grad[0] else None
        store: WeightGradStore | None = ctx.store
        if store is not None and store.key is not None:
            store.defer(ctx.weight, ctx.bias, x, grad_out)
            return grad_in, None, None, None
        x2, g2 = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = (g2.t() @ x2.to(g2.dtype)).to(weight.dtype)
        grad_b = g2.sum(0).to(weight.dtype) if ctx.bias is not None else None
        return grad_in, grad_w, grad_b, None


def _deferrable_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, store: WeightGradStore | None
) -> torch.Tensor:
    out: torch.Tensor = _DeferrableLinear.apply(x, weight, bias, store)  # type: ignore[no-untyped-call]
    return out


class Linear(nn.Module):
    """``nn.Linear`` whose weight gradient can be deferred to a later ``W`` action."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.store: WeightGradStore | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _deferrable_linear(x, self.weight, self.bias, self.store)


class DeferrableLinear(nn.Linear):
    """A ``torch.nn.Linear`` whose weight gradient can be deferred (what :func:`make_deferrable` turns one into)."""

    store: WeightGradStore | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _deferrable_linear(x, self.weight, self.bias, self.store)


def make_deferrable(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` inside ``module`` into a :class:`DeferrableLinear` in place (same parameters,
    same names, same output); returns how many. Models built from ``nn.Linear`` (Hugging Face decoders) so get the
    zero-bubble schedules' input/weight-gradient split; other parameters' gradients are computed during ``I``."""
    count = 0
    for sub in module.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = DeferrableLinear
            count += 1
    return count


def undeferred(module: nn.Module) -> list[str]:
    """Submodules with weight matrices of their own (2 or more dimensions) whose gradients are not deferred to ``W``
    (``I`` computes them): convolutions, ``nn.Linear`` subclasses, custom layers; as ``Type (name)``. Embeddings and
    norms are left out: their gradients are small and computed in ``I`` by design."""
    return [
        f"{type(sub).__name__} ({name})"
        for name, sub in module.named_modules()
        if not isinstance(sub, Linear | DeferrableLinear | nn.Embedding)
        and any(p.dim() >= 2 for p in sub.parameters(recurse=False))
    ]


def set_grad_store(module: nn.Module, store: WeightGradStore | None) -> None:
    """Route deferred weight gradients of every deferrable linear layer inside ``module`` to ``store``."""
    for sub in module.modules():
        if isinstance(sub, Linear | DeferrableLinear):
            sub.store = store
        elif isinstance(sub, StageModule):
            sub._head_store = store


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = Linear(h, 3 * h), Linear(h, h)
        self.fc, self.fc_proj = Linear(h, 4 * h), Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        out: torch.Tensor = x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))
        return out


class StageModule(nn.Module):
    """One pipeline stage: blocks ``layers`` (global indices), plus embeddings and/or head on the ends.

    Parameter names use global block indices (``blocks.7.qkv.weight``), so the stages' names together are the whole
    model's. With tied embeddings the last stage holds its own ``wte.weight`` (same init); the trainer sums the two
    copies' gradients, so they stay equal.
    """

    def __init__(self, cfg: GPTConfig, *, stage_idx: int, num_stages: int, layers: range) -> None:
        super().__init__()
        self.cfg, self.stage_idx = cfg, stage_idx
        self.is_first, self.is_last = stage_idx == 0, stage_idx == num_stages - 1
        h = cfg.hidden
        if self.is_first or (self.is_last and cfg.tied_embeddings):
            self.wte = nn.Embedding(cfg.vocab_size, h)
            _init(self.wte.weight, cfg.seed, _SEED_WTE, 0.02)
        if self.is_first:
            self.wpe = nn.Embedding(cfg.seq_len, h)
            _init(self.wpe.weight, cfg.seed, _SEED_WPE, 0.01)
        self.blocks = nn.ModuleDict()
        proj_std = 0.02 / math.sqrt(2 * cfg.layers)
        for i in layers:
            block = Block(cfg)
            gen = torch.Generator().manual_seed(cfg.seed * 7919 + i + 1)
            for name, lin in (("qkv", block.qkv), ("proj", block.proj), ("fc", block.fc), ("fc_proj", block.fc_proj)):
                std = proj_std if name in ("proj", "fc_proj") else 0.02
                with torch.no_grad():
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
            self.blocks[str(i)] = block
        if self.is_last:
            self.ln_f = nn.LayerNorm(h)
            if not cfg.tied_embeddings:
                self.head = Linear(h, cfg.vocab_size, bias=False)
                _init(self.head.weight, cfg.seed, _SEED_HEAD, 0.02)
        self._head_store: WeightGradStore | None = None

    def set_grad_store(self, store: WeightGradStore | None) -> None:
        """Route deferred weight gradients of every linear layer of this stage to ``store``."""
        set_grad_store(self, store)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, T) on the first stage, else hidden states (B, T, C); returns hidden states or logits (B, T, V)."""
        if self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.blocks.values():
            if self.cfg.activation_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.is_last:
            x = self.ln_f(x)
            if self.cfg.tied_embeddings:
                return _deferrable_linear(x, self.wte.weight, None, self._head_store)
            logits: torch.Tensor = self.head(x)  # (B, T, V)
            return logits
        return x


def _init(param: torch.Tensor, seed: int, salt: int, std: float) -> None:
    gen = torch.Generator().manual_seed(seed * 7919 + salt)
    with torch.no_grad():
        param.copy_(torch.randn(param.shape, generator=gen) * std)


def build_stage(cfg: GPTConfig, *, stage_idx: int, num_stages: int, layers: range, device: torch.device) -> StageModule:
    """Build one stage on ``device`` (initialized on CPU from the seeded generators, then moved)."""
    return StageModule(cfg, stage_idx=stage_idx, num_stages=num_stages, layers=layers).to(device)
