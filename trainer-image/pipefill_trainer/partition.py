"""Split the decoder's blocks over the pipeline's stages so the slowest stage is as fast as possible.

The first stage also runs the embeddings and the last the final norm, output head and loss; their costs are counted
in block-equivalents, so the end stages get fewer blocks. Costs are measured on the device with the model provider's
own stages (:func:`measure_costs`, done once by rank 0 and broadcast, so all ranks agree) or taken from the
provider's FLOP model (:func:`analytic_costs`). An explicit ``spec.pipeline.layersPerStage`` overrides both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pipefill_trainer.provider import LayerCosts, ModelProvider, ProviderError, TensorMeta, check_outputs

__all__ = [
    "LayerCosts",
    "PartSeconds",
    "analytic_costs",
    "check_stage_count",
    "measure_costs",
    "measure_parts",
    "partition_layers",
]


def analytic_costs(provider: ModelProvider) -> LayerCosts:
    """From the provider's FLOP model (:meth:`~pipefill_trainer.provider.ModelProvider.analytic_costs`)."""
    return provider.analytic_costs()


@dataclass(frozen=True)
class PartSeconds:
    """Measured seconds of one microbatch through each part of the model, forward and backward apart."""

    forward: LayerCosts
    backward: LayerCosts


def measure_parts(provider: ModelProvider, *, mb_size: int, device: torch.device, repeats: int = 3) -> PartSeconds:
    """Time forward and backward of one block, the embeddings and the head (with the loss) on ``device``, each the
    median of ``repeats`` after one warm-up. The parts are the provider's own stages of a three-stage cut: the first
    and last with no block (embeddings; final norm, head and loss), the middle one with one block (with activation
    checkpointing its backward re-runs the forward). The provider's code failing here, or a stage not returning what
    it declares, is a :class:`~pipefill_trainer.provider.ProviderError` (permanent: retrying cannot help)."""
    try:
        return _measure_parts(provider, mb_size=mb_size, device=device, repeats=repeats)
    except ProviderError:
        raise
    except Exception as exc:
        raise ProviderError(
            f"model provider {provider.name!r} failed while its parts were measured (its stages of a three-stage cut "
            f"with stand-in inputs of the declared activations): {type(exc).__name__}: {exc}; check build_stage and "
            "that activations() declares what each stage takes and returns"
        ) from None


def _measure_parts(provider: ModelProvider, *, mb_size: int, device: torch.device, repeats: int) -> PartSeconds:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, provider.vocab_size, (mb_size, provider.seq_len), generator=gen).to(device)

    def stage(stage_idx: int, layers: range) -> torch.nn.Module:
        return provider.build_stage(stage_idx=stage_idx, num_stages=3, layers=layers, device=device)

    def inputs(stage_idx: int) -> list[torch.Tensor]:
        metas = provider.activations(stage_idx=stage_idx - 1, num_stages=3, mb_size=mb_size)
        return [_stand_in(meta, gen, device) for meta in metas]

    first, block, last = stage(0, range(0)), stage(1, range(1)), stage(2, range(0))
    block_in, last_in = inputs(1), inputs(2)
    with torch.no_grad():  # each stage returns what it declares (else the shapes below would be wrong too)
        for s, module, args in ((0, first, [tokens]), (1, block, block_in)):
            out = module(*args)
            metas = provider.activations(stage_idx=s, num_stages=3, mb_size=mb_size)
            check_outputs(provider.name, s, metas, out if isinstance(out, tuple) else (out,))

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

    block_f, block_b = timed(lambda: _sum_outputs(block(*block_in)))
    embed_f, embed_b = timed(lambda: _sum_outputs(first(tokens)))
    head_f, head_b = timed(lambda: provider.loss(last(*last_in), tokens))
    return PartSeconds(LayerCosts(block_f, embed_f, head_f), LayerCosts(block_b, embed_b, head_b))


def _stand_in(meta: TensorMeta, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """A tensor of ``meta``'s shape and dtype: small random values (a leaf that wants a gradient) or zeros (ids)."""
    if not meta.dtype.is_floating_point:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=device)
    x = (torch.randn(meta.shape, generator=gen) * 0.02).to(device=device, dtype=meta.dtype)
    return x.requires_grad_(meta.grad)


def _sum_outputs(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o.float().sum() for o in outs if o.requires_grad), torch.zeros((), device=outs[0].device))


def measure_costs(provider: ModelProvider, *, mb_size: int, device: torch.device, repeats: int = 3) -> LayerCosts:
    """Forward + backward seconds of one block, the embeddings and the head on ``device`` (:func:`measure_parts`)."""
    parts = measure_parts(provider, mb_size=mb_size, device=device, repeats=repeats)
    fwd, bwd = parts.forward, parts.backward
    return LayerCosts(block=fwd.block + bwd.block, embed=fwd.embed + bwd.embed, head=fwd.head + bwd.head)


def check_stage_count(provider: ModelProvider, num_stages: int) -> None:
    """Every stage needs at least one of the model's layers."""
    if num_stages > provider.layers:
        raise ValueError(
            f"spec.pipeline: {num_stages} stages (stages × virtualStages) need at least {num_stages} layers, but the "
            f"model {provider.name} has {provider.layers}; use fewer stages or virtual stages, or a deeper model"
        )


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
