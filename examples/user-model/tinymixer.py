"""tinymixer: a small causal language model of our users' making (not a transformer), as a model provider.

A block mixes tokens with a causal depthwise convolution (each position sees the KERNEL positions up to itself)
and channels with an MLP, both residual. The trainer cuts the blocks over the pipeline's stages; the first stage
also holds the embedding, the last the final norm and the head.
"""

import torch
import torch.nn.functional as F
from torch import nn

from pipefill_trainer.provider import LayerCosts, TensorMeta

HIDDEN, KERNEL = 64, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.mix = nn.Conv1d(HIDDEN, HIDDEN, KERNEL, groups=HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):  # (B, T, C)
        y = F.pad(self.norm1(x).transpose(1, 2), (KERNEL - 1, 0))  # (B, C, KERNEL - 1 + T): causal
        x = x + self.mix(y).transpose(1, 2)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def _seeded(seed, make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


class Stage(nn.Module):
    def __init__(self, *, first, last, layers, vocab_size, seed):
        super().__init__()
        # every part seeded by its place in the whole model: any cut starts from the same weights
        self.embed = _seeded(seed, lambda: nn.Embedding(vocab_size, HIDDEN)) if first else None
        self.blocks = nn.ModuleDict({str(i): _seeded(seed + 1 + i, Block) for i in layers})
        self.norm = nn.LayerNorm(HIDDEN) if last else None
        self.head = _seeded(seed - 1, lambda: nn.Linear(HIDDEN, vocab_size, bias=False)) if last else None

    def forward(self, x):  # tokens (B, T) on the first stage, else (B, T, C); logits (B, T, V) on the last
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


class TinyMixer:
    name = "tinymixer"

    def __init__(self, *, seq_len, seed, layers=4, vocab_size=256):
        self.seq_len, self.seed, self.layers, self.vocab_size = seq_len, seed, layers, vocab_size

    def build_stage(self, *, stage_idx, num_stages, layers, device, dtype=None):
        stage = Stage(
            first=stage_idx == 0,
            last=stage_idx == num_stages - 1,
            layers=layers,
            vocab_size=self.vocab_size,
            seed=1000 * self.seed,
        )
        return stage.to(device=device, dtype=dtype or torch.float32)

    def activations(self, *, stage_idx, num_stages, mb_size):
        return (TensorMeta((mb_size, self.seq_len, HIDDEN), torch.float32),)

    def loss(self, output, targets):
        return F.cross_entropy(output.flatten(0, 1).float(), targets.flatten())

    def tied_parameters(self, num_stages):
        return []

    def analytic_costs(self):
        block = 2.0 * (8 * HIDDEN * HIDDEN + KERNEL * HIDDEN)
        return LayerCosts(block=block, embed=0.02 * block, head=2.0 * HIDDEN * self.vocab_size)

    def flops_per_token(self):
        costs = self.analytic_costs()
        return 3.0 * (self.layers * costs.block + costs.head)


def build(*, seq_len, seed):
    return TinyMixer(seq_len=seq_len, seed=seed)
