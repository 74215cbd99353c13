"""What is trained: the GPT-style decoder or a Hugging Face causal LM, its data and its optimizer."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.common import CONFIG_MAP_NAME_PATTERN, code_source_rules
from pipefill.spec.immutable import immutable

__all__ = [
    "LAYERS_CEL",
    "MODEL_PRESETS",
    "Data",
    "DataSource",
    "HuggingFace",
    "Model",
    "ModelCode",
    "ModelDtype",
    "ModelWeights",
    "Optimizer",
    "PythonModel",
]

# Named GPT-style decoders: preset -> (layers, hidden size, attention heads).
MODEL_PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt-tiny": (4, 128, 4),
    "gpt2-small": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt-1.3b": (24, 2048, 16),
    "gpt-7b": (32, 4096, 32),
    "gpt-40b": (48, 8192, 64),
}

# Why a field that says which weights the job trains is immutable (docs/operator.md, "Changing a running job").
_WEIGHTS = "the job's checkpoints hold the weights of the model it names, and a resume loads them"
_ANOTHER = "to train another model, create a new job with its own spec.checkpoint.path"
_OUR_GPT = "!has(self.huggingFace) && !has(self.python)"  # the shape fields are ours (the others' are their own)

# The preset table as a CEL map literal, for rules that need a preset's layer count.
LAYERS_CEL = "{" + ", ".join(f"'{k}': {v[0]}" for k, v in MODEL_PRESETS.items()) + "}"


class DataSource(enum.StrEnum):
    SYNTHETIC = "synthetic"
    TOKEN_FILE = "tokenFile"
    TEXT = "text"
    JSONL = "jsonl"
    PARQUET = "parquet"


class ModelWeights(enum.StrEnum):
    RANDOM = "random"
    PRETRAINED = "pretrained"


class ModelDtype(enum.StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


@dataclass
class HuggingFace:
    """A Hugging Face causal LM (transformers; docs/trainer.md lists the tested families) from its directory:
    config.json, optionally *.safetensors weights (save_pretrained layout) and a tokenizer."""

    path: str = field(
        doc="Directory holding config.json (and *.safetensors for pretrained weights), in the trainer container; "
        "relative to its working directory.",
        max_length=4096,
    )
    claim_name: str | None = field(
        doc="PersistentVolumeClaim holding the directory, mounted read-only at path into the trainer only.",
        max_length=253,
        default=None,
    )
    config_map: str | None = field(
        doc="ConfigMap whose keys (config.json) are mounted read-only at path into the trainer only: a config alone, "
        "for random init; excludes claimName.",
        max_length=253,
        default=None,
    )
    weights: ModelWeights = field(
        doc="random: initialized from spec.data.seed (the same weights for any cut); pretrained: read from the "
        "directory's *.safetensors.",
        default=ModelWeights.RANDOM,
    )
    dtype: ModelDtype = field(
        doc="Weights and activations between stages: float32, or bfloat16 (half the memory and traffic; on a GPU).",
        default=ModelDtype.FLOAT32,
    )
    export_path: str | None = field(
        doc="Where the trained weights are written at the end of training as a Hugging Face directory "
        "(save_pretrained layout: config.json, model.safetensors), loadable as pretrained weights; on a volume the "
        "trainer writes, e.g. under spec.checkpoint.path. Needs checkpoint format dcp (the default here).",
        max_length=4096,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="!has(self.claimName) || !has(self.configMap)",
            message="spec.model.huggingFace: set claimName (a volume with the directory) or configMap (a config "
            "alone), not both",
            field_path=".configMap",
        ),
        Rule(
            rule="!has(self.configMap) || !has(self.weights) || self.weights == 'random'",
            message="spec.model.huggingFace.weights pretrained needs the weights' files: a ConfigMap holds a config "
            "alone; put the directory on a volume (claimName) or use weights: random",
            field_path=".weights",
        ),
        *(
            immutable(camel, path=f"spec.model.huggingFace.{camel}", why=_WEIGHTS, instead=_ANOTHER)
            for camel in ("path", "claimName", "configMap", "dtype")
        ),
    )


@dataclass
class ModelCode:
    """Where the module of ``spec.model.python.function`` comes from when the trainer image does not hold it."""

    path: str | None = field(
        doc="A directory on the job's fill storage (spec.fill.storage; mounted read-only into the trainer too), "
        "relative to its mount (pipefill local: the working directory); its modules import each other relatively.",
        max_length=1024,
        default=None,
    )
    config_map: str | None = field(
        doc="A ConfigMap whose keys are the module files (name.py), mounted read-only into the trainer (pipefill "
        "local: the ConfigMap manifest given with -f).",
        max_length=253,
        pattern=CONFIG_MAP_NAME_PATTERN,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = code_source_rules("spec.model.python.code")


@dataclass
class PythonModel:
    """Your own model: a function that returns a model provider (docs/trainer.md, "User code")."""

    function: str = field(
        doc="package.module:function returning the model provider (pipefill_trainer.provider.ModelProvider); called "
        "with the keyword arguments seq_len (spec.model.seqLen) and seed (spec.data.seed).",
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        max_length=512,
    )
    code: ModelCode | None = field(
        doc="Where the function's module comes from when the trainer image does not hold it (an image built FROM "
        "ours): a directory on the fill storage or a ConfigMap.",
        default=None,
    )


@dataclass
class Model:
    """The decoder to train: our GPT-style decoder (a named preset, or layers, hiddenSize and heads), or a Hugging
    Face causal LM (huggingFace)."""

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
        doc="Share the token embedding with the output head (on the first and last stage); a Hugging Face model "
        "ties as its config says (tie_word_embeddings).",
        default=False,
    )
    hugging_face: HuggingFace | None = field(
        doc="A Hugging Face causal LM instead of our GPT: its shape and vocabulary come from its config.json; "
        "excludes preset, layers, hiddenSize and heads.",
        default=None,
    )
    python: PythonModel | None = field(
        doc="Your own model, from your code, instead of our GPT: excludes huggingFace, preset, layers, hiddenSize and "
        "heads.",
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="has(self.huggingFace) || has(self.python) ? !(has(self.huggingFace) && has(self.python))"
            " && !has(self.preset) && !has(self.layers) && !has(self.hiddenSize) && !has(self.heads)"
            " : has(self.preset) ? !has(self.layers) && !has(self.hiddenSize) && !has(self.heads)"
            " : has(self.layers) && has(self.hiddenSize) && has(self.heads)",
            message="spec.model: set either preset, or all of layers, hiddenSize and heads (not both), or huggingFace"
            " or python alone (the model gives its shape)",
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
        Rule(
            rule="has(self.huggingFace) == has(oldSelf.huggingFace) && has(self.python) == has(oldSelf.python)",
            message="spec.model.huggingFace and spec.model.python cannot be added or removed (our GPT, a Hugging Face "
            f"model and your own cannot replace each other): {_WEIGHTS}; {_ANOTHER}",
            field_path=".huggingFace",
        ),
        *(
            immutable(camel, path=f"spec.model.{camel}", why=why, instead=_ANOTHER, when=_OUR_GPT)
            for camel, why in (
                ("preset", _WEIGHTS),
                ("layers", _WEIGHTS),
                ("hiddenSize", _WEIGHTS),
                ("heads", _WEIGHTS),
                ("vocabSize", _WEIGHTS),
                ("tiedEmbeddings", _WEIGHTS),
                ("seqLen", "our GPT's position embedding, in the job's checkpoints, has one row per token of it"),
            )
        ),
    )

    def dims(self) -> tuple[int, int, int]:
        """(layers, hidden size, heads), resolving the preset; a Hugging Face model's are in its config.json."""
        if self.hugging_face is not None:
            raise ValueError(
                "spec.model.huggingFace: layers, hidden size and heads are in the model's config.json "
                f"({self.hugging_face.path}), not in the spec; read them there"
            )
        if self.python is not None:
            raise ValueError(
                f"spec.model.python: the shape of the model is its provider's ({self.python.function}), not the spec's"
            )
        if self.preset is not None:
            return MODEL_PRESETS[self.preset]
        if self.layers is None or self.hidden_size is None or self.heads is None:
            raise ValueError("spec.model: set either preset, or all of layers, hiddenSize and heads")
        return self.layers, self.hidden_size, self.heads


@dataclass
class Data:
    """Where training tokens come from."""

    source: DataSource = field(
        doc="synthetic (random tokens), tokenFile (uint16 tokens, memory-mapped), text (UTF-8 bytes), jsonl (JSON "
        "lines) or parquet (a Parquet file): their textField tokenized with the tokenizer and packed into sequences.",
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
    text_field: str = field(
        doc="source jsonl or parquet: the key of each line's text, or the text column.", max_length=256, default="text"
    )
    tokenizer: str | None = field(
        doc="source jsonl or parquet: a tokenizer.json (Hugging Face tokenizers) in the trainer container; default: the one in "
        "spec.model.huggingFace.path.",
        max_length=4096,
        default=None,
    )

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
