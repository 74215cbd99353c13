"""What is trained: the GPT-style decoder, its data and its optimizer."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field

__all__ = ["LAYERS_CEL", "MODEL_PRESETS", "Data", "DataSource", "Model", "Optimizer"]

# Named GPT-style decoders: preset -> (layers, hidden size, attention heads).
MODEL_PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt-tiny": (4, 128, 4),
    "gpt2-small": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt-1.3b": (24, 2048, 16),
    "gpt-7b": (32, 4096, 32),
    "gpt-40b": (48, 8192, 64),
}

# The preset table as a CEL map literal, for rules that need a preset's layer count.
LAYERS_CEL = "{" + ", ".join(f"'{k}': {v[0]}" for k, v in MODEL_PRESETS.items()) + "}"


class DataSource(enum.StrEnum):
    SYNTHETIC = "synthetic"
    TOKEN_FILE = "tokenFile"
    TEXT = "text"


@dataclass
class Model:
    """The GPT-style decoder to train: a named preset, or layers, hiddenSize and heads."""

    preset: str | None = field(
        doc="Named model size (" + ", ".join(MODEL_PRESETS) + "); excludes layers, hiddenSize and heads.",
        pattern="^(" + "|".join(k.replace(".", r"\.") for k in MODEL_PRESETS) + ")$",
        default=None,
    )
    layers: int | None = field(
        doc="Decoder blocks; split over the pipeline's stages.", minimum=1, maximum=1024, default=None
    )
    hidden_size: int | None = field(doc="Model width; a multiple of heads.", minimum=8, maximum=65536, default=None)
    heads: int | None = field(doc="Attention heads per block.", minimum=1, maximum=1024, default=None)
    seq_len: int = field(doc="Tokens per sample (context length).", minimum=8, maximum=1048576, default=128)
    vocab_size: int = field(
        doc="Vocabulary size; 256 is the byte-level tokenizer.", minimum=2, maximum=1048576, default=256
    )
    tied_embeddings: bool = field(
        doc="Share the token embedding with the output head (on the first and last stage).", default=False
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="has(self.preset) ? !has(self.layers) && !has(self.hiddenSize) && !has(self.heads)"
            " : has(self.layers) && has(self.hiddenSize) && has(self.heads)",
            message="spec.model: set either preset, or all of layers, hiddenSize and heads (not both)",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.hiddenSize) || !has(self.heads) || self.hiddenSize % self.heads == 0",
            message="spec.model.hiddenSize must be a multiple of heads",
            message_expression="'spec.model.hiddenSize %d must be a multiple of heads (%d); set hiddenSize to %d"
            " or heads to a divisor of it'.format([self.hiddenSize, self.heads,"
            " self.hiddenSize / self.heads * self.heads + self.heads])",
            field_path=".hiddenSize",
        ),
    )

    def dims(self) -> tuple[int, int, int]:
        """(layers, hidden size, heads), resolving the preset."""
        if self.preset is not None:
            return MODEL_PRESETS[self.preset]
        if self.layers is None or self.hidden_size is None or self.heads is None:
            raise ValueError("spec.model: set either preset, or all of layers, hiddenSize and heads")
        return self.layers, self.hidden_size, self.heads


@dataclass
class Data:
    """Where training tokens come from."""

    source: DataSource = field(
        doc="synthetic (random tokens), tokenFile (uint16 tokens, memory-mapped) or text (UTF-8 bytes).",
        default=DataSource.SYNTHETIC,
    )
    path: str | None = field(
        doc="File path inside the trainer container; required for tokenFile and text.", max_length=4096, default=None
    )
    claim_name: str | None = field(
        doc="PersistentVolumeClaim holding the file, mounted read-only at the path's directory.",
        max_length=253,
        default=None,
    )
    seed: int = field(doc="Seed for synthetic tokens and data order.", minimum=0, maximum=2**31 - 1, default=0)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.source == 'synthetic' ? !has(self.path) : has(self.path)",
            message="spec.data.path is required for source tokenFile and text, and not allowed for synthetic",
            field_path=".path",
            reason="FieldValueRequired",
        ),
    )


@dataclass
class Optimizer:
    """AdamW settings."""

    learning_rate: float = field(doc="Peak learning rate.", minimum=0, maximum=10, exclusive_minimum=True, default=3e-4)
    weight_decay: float = field(doc="Decoupled weight decay.", minimum=0, maximum=1, default=0.1)
    beta1: float = field(doc="AdamW β1.", minimum=0, maximum=1, default=0.9)
    beta2: float = field(doc="AdamW β2.", minimum=0, maximum=1, default=0.95)
    grad_clip: float = field(
        doc="Clip the global gradient norm to this; 0 disables clipping.", minimum=0, maximum=1e6, default=1.0
    )
    warmup_steps: int = field(doc="Linear learning-rate warm-up steps.", minimum=0, maximum=10**9, default=0)
