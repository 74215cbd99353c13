"""``encoder-inference``: a BERT-style transformer encoder that embeds every sample of a token dataset.

Parameters (spec.workload.parameters): ``layers`` (2), ``hiddenSize`` (64), ``heads`` (4), ``seqLen`` (32),
``vocab`` (1024), ``seed`` (0: weights and synthetic data), ``batchSizes`` (profiler candidates),
``commitEverySamples`` (0: commit at most once a second; N: commit once N samples are done, at the end of a bubble:
less work redone after a crash, more commits). Output per sample:
its masked-mean-pooled last hidden state, float32 ``(hiddenSize,)``, with its sample id.

Weights come from a fixed seed and the model runs in eval mode without dropout, so outputs are deterministic: a run
interrupted and resumed gives byte-identical outputs to an uninterrupted one (for the same batch sizes; each sample's
row is computed independently of the others in the batch by these kernels, which tests/fill check).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from pipefill_fill.builtins.datasets import open_dataset, token_dataset
from pipefill_fill.pieces import PieceSteps
from pipefill_fill.workload import SampleWorkload, WorkloadContext

__all__ = ["Encoder", "EncoderInference"]


class _Layer(nn.Module):
    """Post-norm BERT layer: self-attention and a GELU feed-forward, each with a residual and LayerNorm."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, 4 * hidden)
        self.ff2 = nn.Linear(4 * hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)  # each (B, H, T, D)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])  # (B, H, T, D)
        x = self.norm1(x + self.proj(att.transpose(1, 2).reshape(b, t, c)))
        out: torch.Tensor = self.norm2(x + self.ff2(F.gelu(self.ff1(x))))
        return out


class Encoder(nn.Module):
    """Token + position embeddings, ``layers`` encoder layers, masked mean pooling."""

    def __init__(self, *, vocab: int, seq_len: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(_Layer(hidden, heads) for _ in range(layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x, keep = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, keep)
        return self.pool(x, keep)

    def embed(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedded tokens ``(B, T, C)`` and the attention mask ``(B, T)``."""
        keep = tokens != 0  # (B, T)
        keep[:, 0] = True  # an all-padding row still attends to something
        x = self.norm(self.tok(tokens) + self.pos.weight[None, : tokens.shape[1]])  # (B, T, C)
        return x, keep

    @staticmethod
    def pool(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Masked mean over the tokens, ``(B, C)``."""
        w = keep.to(x.dtype)[..., None]  # (B, T, 1)
        pooled: torch.Tensor = (x * w).sum(1) / w.sum(1)  # (B, C)
        return pooled


class EncoderInference(PieceSteps, SampleWorkload):
    """Partial steps (:mod:`pipefill_fill.pieces`): one piece per encoder layer, the embedding in the first and the
    pooling in the last."""

    kind: ClassVar[str] = "inference"

    def __init__(self, context: WorkloadContext) -> None:
        super().__init__(context)
        p = context.param
        self.layers = p("layers", 2, int)
        self.hidden = p("hiddenSize", 64, int)
        self.heads = p("heads", 4, int)
        self.seq_len = p("seqLen", 32, int)
        self.vocab = p("vocab", 1024, int)
        self.seed = p("seed", 0, int)
        every = p("commitEverySamples", 0, int)
        if every < 0:
            raise ValueError(f"spec.workload.parameters.commitEverySamples: {every} must be ≥ 0 (0: once a second)")
        self.commit_every = every or None
        if self.hidden % self.heads:
            raise ValueError(
                f"spec.workload.parameters.hiddenSize: {self.hidden} must be divisible by heads ({self.heads})"
            )
        if not 1 <= self.vocab <= 65536:
            raise ValueError(f"spec.workload.parameters.vocab: {self.vocab} must be within 1..65536 (uint16 tokens)")
        self.device = torch.device("cpu")
        self.model: Encoder | None = None
        self.tokens: np.ndarray | None = None
        self._previous: EncoderInference | None = None

    def reuse(self, previous: object) -> None:
        """The model of the executor's last slice or job of this workload (same parameters and code): its weights
        come from the seed alone and inference does not change them, so ``setup`` takes them instead of building."""
        if isinstance(previous, EncoderInference) and previous.model is not None:
            self._previous = previous

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        ctx = self.context
        if ctx.input_path is not None:
            self.tokens = open_dataset(ctx.input_path)
            if self.tokens.ndim != 2 or self.tokens.dtype != np.uint16 or self.tokens.shape[0] < ctx.total:
                raise ValueError(
                    f"spec.input.path: {str(ctx.input_path)!r} holds {self.tokens.dtype} {self.tokens.shape}; "
                    f"encoder-inference needs uint16 (N, T) tokens with N ≥ totalSamples ({ctx.total})"
                )
            self.seq_len = min(self.seq_len, self.tokens.shape[1])
        else:
            name = f"dataset-tokens-{ctx.total}x{self.seq_len}-v{self.vocab}-s{self.seed}.npy"
            self.tokens = token_dataset(
                ctx.output_dir / name, samples=ctx.total, seq_len=self.seq_len, vocab=self.vocab, seed=self.seed
            )
        prev, self._previous = self._previous, None
        if prev is not None and prev.model is not None and self._same_model(prev) and prev.device == device:
            self.device, self.model = device, prev.model
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = Encoder(
                vocab=self.vocab, seq_len=self.seq_len, hidden=self.hidden, heads=self.heads, layers=self.layers
            )
        weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        if weight_bytes > memory_budget_bytes:
            raise ValueError(
                f"spec.workload.parameters: the encoder's weights need {weight_bytes} bytes, more than the fill's memory "
                f"budget ({memory_budget_bytes}); make layers or hiddenSize smaller, or raise spec.fill.reservedMemory"
            )
        self.device = device
        self.model = model.to(device).eval()

    def _same_model(self, other: EncoderInference) -> bool:
        mine = (self.vocab, self.seq_len, self.hidden, self.heads, self.layers, self.seed)
        return mine == (other.vocab, other.seq_len, other.hidden, other.heads, other.layers, other.seed)

    @torch.inference_mode()
    def step(self, batch_size: int) -> int:
        if self.model is None or self.tokens is None:
            raise RuntimeError("EncoderInference.step called before setup")
        start, end = self.take(batch_size)
        if end <= start:
            return 0
        batch = torch.from_numpy(np.array(self.tokens[start:end, : self.seq_len], dtype=np.int64)).to(self.device)
        pooled = self.model(batch).float().cpu().numpy()  # (B, C)
        self.context.emit(np.arange(start, end, dtype=np.int64), pooled)
        return end - start

    def pieces(self, batch_size: int) -> int:
        return max(1, int(self.layers))

    @torch.inference_mode()
    def start_batch(self, batch_size: int) -> tuple[int, int, torch.Tensor, torch.Tensor | None] | None:
        if self.model is None or self.tokens is None:
            raise RuntimeError("EncoderInference.start_batch called before setup")
        start, end = self.peek(batch_size)
        if end <= start:
            return None
        batch = torch.from_numpy(np.array(self.tokens[start:end, : self.seq_len], dtype=np.int64)).to(self.device)
        return start, end, batch, None

    @torch.inference_mode()
    def run_piece(
        self, carry: tuple[int, int, torch.Tensor, torch.Tensor | None], index: int
    ) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        assert self.model is not None  # for mypy: start_batch checked
        start, end, x, keep = carry
        if keep is None:  # the first piece: x holds the tokens
            x, keep = self.model.embed(x)
        layers = self.model.layers
        return start, end, layers[index](x, keep) if index < len(layers) else x, keep

    @torch.inference_mode()
    def finish_batch(self, carry: tuple[int, int, torch.Tensor, torch.Tensor]) -> int:
        start, end, x, keep = carry
        pooled = Encoder.pool(x, keep).float().cpu().numpy()  # (B, C)
        self.context.emit(np.arange(start, end, dtype=np.int64), pooled)
        self.next_sample = end
        return end - start

    def modules(self) -> list[torch.nn.Module | torch.optim.Optimizer]:
        return [self.model] if self.model is not None else []
