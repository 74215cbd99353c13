"""Split the decoder's blocks over the pipeline's stages so the slowest stage is as fast as possible.

The first stage also runs the embeddings and the last the final norm, output head and loss; their costs are counted
in block-equivalents, so the end stages get fewer blocks. Costs are measured on the device
(:func:`measure_costs`, done once by rank 0 and broadcast, so all ranks agree) or taken from the FLOP model
(:func:`analytic_costs`). An explicit ``spec.pipeline.layersPerStage`` overrides both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipefill_trainer.model import Block, GPTConfig, StageModule

__all__ = ["LayerCosts", "PartSeconds", "analytic_costs", "measure_costs", "measure_parts", "partition_layers"]


@dataclass(frozen=True)
class LayerCosts:
    """Relative cost of one microbatch's forward + backward through each part of the model (any unit)."""

    block: float
    embed: float
    head: float


def analytic_costs(cfg: GPTConfig) -> LayerCosts:
    """From FLOPs: a block's matmuls and attention, the head's projection onto the vocabulary; embeddings ~ free."""
    return LayerCosts(
        block=cfg.block_flops_per_token(), embed=0.02 * cfg.block_flops_per_token(), head=cfg.head_flops_per_token()
    )


@dataclass(frozen=True)
class PartSeconds:
    """Measured seconds of one microbatch through each part of the model, forward and backward apart."""

    forward: LayerCosts
    backward: LayerCosts


def measure_parts(cfg: GPTConfig, *, mb_size: int, device: torch.device, repeats: int = 3) -> PartSeconds:
    """Time forward and backward of one block, the embeddings and the head (with the loss) on ``device``, each the
    median of ``repeats`` after one warm-up. With activation checkpointing a block's backward re-runs its forward."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (mb_size, cfg.seq_len), generator=gen).to(device)
    hidden = torch.randn(mb_size, cfg.seq_len, cfg.hidden, generator=gen).to(device)
    whole = GPTConfig(**{**cfg.__dict__, "layers": 1, "activation_checkpointing": False})
    first = StageModule(whole, stage_idx=0, num_stages=2, layers=range(0)).to(device)
    last = StageModule(whole, stage_idx=1, num_stages=2, layers=range(0)).to(device)
    block = Block(cfg).to(device)
    for lin in (block.qkv, block.proj, block.fc, block.fc_proj):
        torch.nn.init.normal_(lin.weight, std=0.02)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(forward: Callable[[], torch.Tensor]) -> tuple[float, float]:
        fwd, bwd = [], []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            out = forward()
            sync()
            mid = time.perf_counter()
            torch.autograd.backward(out)
            sync()
            fwd.append(mid - start)
            bwd.append(time.perf_counter() - mid)
        return statistics.median(fwd[1:]), statistics.median(bwd[1:])  # the first is warm-up

    block_f, block_b = timed(lambda: block(hidden.detach().requires_grad_()).sum())
    embed_f, embed_b = timed(lambda: first(tokens).sum())
    head_f, head_b = timed(
        lambda: F.cross_entropy(last(hidden.detach().requires_grad_()).flatten(0, 1), tokens.flatten())
    )
    if cfg.activation_checkpointing:
        block_b += block_f
    return PartSeconds(LayerCosts(block_f, embed_f, head_f), LayerCosts(block_b, embed_b, head_b))


def measure_costs(cfg: GPTConfig, *, mb_size: int, device: torch.device, repeats: int = 3) -> LayerCosts:
    """Forward + backward seconds of one block, the embeddings and the head on ``device`` (:func:`measure_parts`)."""
    parts = measure_parts(cfg, mb_size=mb_size, device=device, repeats=repeats)
    fwd, bwd = parts.forward, parts.backward
    return LayerCosts(block=fwd.block + bwd.block, embed=fwd.embed + bwd.embed, head=fwd.head + bwd.head)


def partition_layers(
    layers: int, stages: int, *, costs: LayerCosts, layers_per_stage: Sequence[int] | None = None
) -> list[range]:
    """Contiguous block ranges, one per stage (every stage ≥ 1 block), minimizing the largest stage cost."""
    if layers_per_stage is not None:
        counts = list(layers_per_stage)
        if len(counts) != stages or sum(counts) != layers or min(counts) < 1:
            raise ValueError(
                f"spec.pipeline.layersPerStage={counts} must have {stages} entries (stages × virtualStages), each ≥ 1, "
                f"summing to the model's {layers} layers; fix the list or remove it to balance by cost"
            )
        return _ranges(counts)
    if stages > layers:
        raise ValueError(f"{stages} stages need at least {stages} layers, the model has {layers}; use fewer stages")

    def stage_cost(first: int, end: int, stage_idx: int) -> float:
        cost = (end - first) * costs.block
        if stage_idx == 0:
            cost += costs.embed
        if stage_idx == stages - 1:
            cost += costs.head
        return cost

    # best[s][n]: minimal max-cost of placing the first n blocks on stages 0..s-1; cut[s][n]: where stage s-1 starts
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    cut = [[0] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for n in range(s, layers - (stages - s) + 1):
            for k in range(s - 1, n):  # stage s-1 holds blocks k..n-1
                value = max(best[s - 1][k], stage_cost(k, n, s - 1))
                if value < best[s][n] - 1e-12:
                    best[s][n], cut[s][n] = value, k
    counts, n = [], layers
    for s in range(stages, 0, -1):
        k = cut[s][n]
        counts.append(n - k)
        n = k
    return _ranges(counts[::-1])


def _ranges(counts: Sequence[int]) -> list[range]:
    out, start = [], 0
    for count in counts:
        out.append(range(start, start + count))
        start += count
    return out
