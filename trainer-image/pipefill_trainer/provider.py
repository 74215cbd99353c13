"""What the trainer needs of a model: the *model provider* interface, and our GPT as one provider.

The executor, the partitioner, the profiler, the replay peers and the bubble prediction see a model only through a
:class:`ModelProvider`: it builds one stage's modules for (stage index, stage count, the stage's layers, device,
dtype), says what tensors flow between stages (:class:`TensorMeta`, any number, each with its shape and dtype), computes
the loss, names the parameters several stages hold (:class:`TiedParameter`) and gives the relative costs the
partitioner balances. A stage module takes its inputs as positional arguments — the token ids (B, T) on the first
stage, else the previous stage's outputs in the order of :meth:`ModelProvider.activations` — and returns a tensor or a
tuple of them (the logits on the last stage). Its ``state_dict`` names are the whole model's, so the stages' state
dicts together are the unsplit model's.

Stage index: of the schedule's stages (``ranks × virtualStages``), not of a rank. Layers: the stage's contiguous
range of the model's :attr:`ModelProvider.layers` repeated blocks (decoder layers), chosen by the partitioner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from pipefill_trainer.model import GPTConfig, StageModule

__all__ = [
    "GPTProvider",
    "LayerCosts",
    "ModelProvider",
    "ProviderError",
    "TensorMeta",
    "TiedParameter",
    "check_outputs",
]


class ProviderError(ValueError):
    """A model provider that cannot work: it does not load, raises, is not a provider, or its stages do not return
    what it declares. Permanent (exit 2); the message names the provider and the fix."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor a stage sends to the next, per microbatch."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    grad: bool = True
    """whether its gradient flows back (floating point tensors the next stage differentiates); False for token ids,
    position ids, masks"""

    @property
    def nbytes(self) -> int:
        numel = 1
        for n in self.shape:
            numel *= n
        return numel * torch.empty((), dtype=self.dtype).element_size()


def check_outputs(
    provider_name: str, stage_idx: int, metas: tuple[TensorMeta, ...], outs: tuple[torch.Tensor, ...]
) -> None:
    """A :class:`ProviderError` unless stage ``stage_idx``'s outputs are what its provider declared."""
    got = [(tuple(t.shape), t.dtype) for t in outs]
    if got != [(meta.shape, meta.dtype) for meta in metas]:
        raise ProviderError(
            f"model provider {provider_name!r}: stage {stage_idx} returned {len(outs)} tensors "
            f"{[(list(shape), str(dtype)) for shape, dtype in got]}, but its activations() declare "
            f"{[(list(m.shape), str(m.dtype)) for m in metas]}; make the stage's outputs match its declaration"
        )


@dataclass(frozen=True)
class TiedParameter:
    """One parameter held by several stages (tied input and output embeddings): its name in each stage's module.

    Each holder initializes its copy equally; the trainer sums the copies' gradients (or makes them one tensor where
    one rank holds several), so they stay equal.
    """

    names: Mapping[int, str]
    """stage index → parameter name in that stage's module (``named_parameters``)"""

    @property
    def owner(self) -> int:
        """The stage whose copy counts for the gradient norm and is the one saved as the model's."""
        return min(self.names)


@dataclass(frozen=True)
class LayerCosts:
    """Relative cost of one microbatch's forward + backward through each part of the model (any unit)."""

    block: float
    embed: float
    head: float


class ModelProvider(Protocol):
    """A model the trainer can cut into pipeline stages. See the module docstring for the stage module's contract."""

    @property
    def name(self) -> str:
        """For messages and records, e.g. ``gpt`` or ``huggingface:llama``."""

    @property
    def layers(self) -> int:
        """The repeated blocks the partitioner distributes (every stage gets at least one)."""

    @property
    def seq_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def build_stage(
        self, *, stage_idx: int, num_stages: int, layers: range, device: torch.device, dtype: torch.dtype | None = None
    ) -> nn.Module:
        """The stage's modules on ``device`` (weights in ``dtype``; None: the provider's default), and only those."""

    def activations(self, *, stage_idx: int, num_stages: int, mb_size: int) -> tuple[TensorMeta, ...]:
        """What stage ``stage_idx`` sends to stage ``stage_idx + 1`` for one microbatch of ``mb_size`` sequences."""

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of one microbatch from the last stage's output and the targets (B, T)."""

    def tied_parameters(self, num_stages: int) -> list[TiedParameter]:
        """Parameters held by several of the ``num_stages`` stages."""

    def analytic_costs(self) -> LayerCosts:
        """Relative costs from a FLOP model, used where nothing is measured (an explicit layer cut)."""

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), for model TFLOP/s."""


@dataclass(frozen=True)
class GPTProvider:
    """Our GPT decoder (:mod:`pipefill_trainer.model`): one float32 hidden state (B, T, C) between stages; the
    embedding tied to the head when ``cfg.tied_embeddings``."""

    cfg: GPTConfig
    name: str = "gpt"

    @property
    def layers(self) -> int:
        return self.cfg.layers

    @property
    def seq_len(self) -> int:
        return self.cfg.seq_len

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def build_stage(
        self, *, stage_idx: int, num_stages: int, layers: range, device: torch.device, dtype: torch.dtype | None = None
    ) -> nn.Module:
        module = StageModule(self.cfg, stage_idx=stage_idx, num_stages=num_stages, layers=layers)
        return module.to(device=device, dtype=dtype or torch.float32)

    def activations(self, *, stage_idx: int, num_stages: int, mb_size: int) -> tuple[TensorMeta, ...]:
        return (TensorMeta((mb_size, self.cfg.seq_len, self.cfg.hidden), torch.float32),)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1).float(), targets.flatten())  # output: (B, T, V) logits

    def tied_parameters(self, num_stages: int) -> list[TiedParameter]:
        if not self.cfg.tied_embeddings or num_stages < 2:
            return []
        return [TiedParameter({0: "wte.weight", num_stages - 1: "wte.weight"})]

    def analytic_costs(self) -> LayerCosts:
        """A block's matmuls and attention, the head's projection onto the vocabulary; embeddings ~ free."""
        block = self.cfg.block_flops_per_token()
        return LayerCosts(block=block, embed=0.02 * block, head=self.cfg.head_flops_per_token())

    def flops_per_token(self) -> float:
        return self.cfg.flops_per_token()
