"""Training tokens: a memory-mapped token file, a text file read as bytes, JSON lines tokenized with the model's
tokenizer, or synthetic tokens.

Each step's samples are windows of ``seq_len + 1`` tokens at offsets drawn from a generator seeded by
(seed, step): the data position *is* the step number, so resuming at step ``k`` reads exactly what an uninterrupted run
reads, and no rank needs to load the file — ``numpy.memmap`` pages in only the windows it touches, so the file can be
as large as the disk.

The byte-level tokenizer (vocabulary 256) maps text to its UTF-8 bytes; good enough for the demo's loss to fall.
JSON lines (``source: jsonl``) and Parquet (``source: parquet``, the ``textField`` column): each text is tokenized with a Hugging Face ``tokenizer.json`` (the
``tokenizers`` library; the model's own by default) at start, the documents joined with the tokenizer's end-of-text
token where it has one, and held in memory (int32): sequences are windows of that stream, so documents are packed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from pipefill.spec.training import Data, DataSource

__all__ = ["TokenSource", "decode", "encode"]


def encode(text: str) -> list[int]:
    """Byte-level tokenizer: the UTF-8 bytes, vocabulary 256."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", errors="replace")


class TokenSource:
    """Deterministic batches of one data-parallel replica: ``batch(step)`` → (tokens, targets), each (N, T).

    ``replica_batch``: samples per step of one replica (N, the pipeline shape's); ``replicas``: how many replicas
    share the step's samples (their batches are disjoint slices of the same ``replica_batch × replicas`` draw).
    """

    def __init__(
        self,
        data: Data,
        *,
        vocab_size: int,
        seq_len: int,
        replica_batch: int,
        replicas: int,
        tokenizer: Path | None = None,
    ) -> None:
        self.source, self.seed = DataSource(data.source), data.seed
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.global_batch, self.per_replica = replica_batch * replicas, replica_batch
        self._tokens: np.ndarray | None = None
        """``tokenizer``: the tokenizer.json of source jsonl"""
        if self.source != DataSource.SYNTHETIC:
            path = Path(data.path or "")
            if not path.is_file():
                raise FileNotFoundError(f"spec.data.path {str(path)!r} is not a file; mount the data or fix the path")
            if self.source in (DataSource.JSONL, DataSource.PARQUET):
                texts = (
                    _jsonl(path, data.text_field)
                    if self.source == DataSource.JSONL
                    else _parquet(path, data.text_field)
                )
                self._tokens = _tokenize(texts, tokenizer=tokenizer, source=str(self.source))
            elif self.source == DataSource.TEXT:
                if vocab_size < 256:
                    raise ValueError(
                        f"spec.model.vocabSize {vocab_size} is too small for source text (byte-level tokens 0..255); "
                        "set vocabSize: 256"
                    )
                self._tokens = np.memmap(path, dtype=np.uint8, mode="r")
            else:
                self._tokens = np.memmap(path, dtype=np.uint16, mode="r")
            if len(self._tokens) < seq_len + 2:
                raise ValueError(
                    f"spec.data.path {str(path)!r} holds {len(self._tokens)} tokens, fewer than seqLen + 2 = "
                    f"{seq_len + 2}; use a larger file or a shorter seqLen"
                )

    def batch(self, step: int, *, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._rows(step, dp_rank)  # (N, T + 1) int64
        return rows[:, :-1], rows[:, 1:]

    def microbatches(self, step: int, *, dp_rank: int, m: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        tokens, targets = self.batch(step, dp_rank=dp_rank)
        return list(tokens.chunk(m)), list(targets.chunk(m))

    def _rows(self, step: int, dp_rank: int) -> torch.Tensor:
        lo, n, t = dp_rank * self.per_replica, self.per_replica, self.seq_len + 1
        if self._tokens is None:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            full = torch.randint(0, self.vocab_size, (self.global_batch, t), generator=gen)
            return full[lo : lo + n]
        rng = np.random.default_rng([self.seed, step])
        offsets = rng.integers(0, len(self._tokens) - t, size=self.global_batch)[lo : lo + n]
        rows = np.stack([np.asarray(self._tokens[o : o + t]) for o in offsets]).astype(np.int64)
        if rows.max(initial=0) >= self.vocab_size:
            raise ValueError(
                f"spec.data.path holds token {int(rows.max())} ≥ spec.model.vocabSize {self.vocab_size}; "
                "raise vocabSize to the tokenizer's vocabulary"
            )
        return torch.from_numpy(rows)


_END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")  # what tokenizers call the document separator


def _tokenize(texts: list[str], *, tokenizer: Path | None, source: str) -> np.ndarray:
    """The documents tokenized and concatenated, each followed by the end-of-text token."""
    if tokenizer is None or not tokenizer.is_file():
        raise ValueError(
            f"spec.data.source {source} needs a tokenizer: {str(tokenizer) if tokenizer else 'none given'} is not a "
            "file; set spec.data.tokenizer to a tokenizer.json, or put the model's tokenizer.json in "
            "spec.model.huggingFace.path"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(
            f"spec.data.source {source} needs the tokenizers library: use the trainer image, or install "
            "pipefill-operator[trainer,huggingface]"
        ) from None
    tok = Tokenizer.from_file(str(tokenizer))
    end = next((i for name in _END_OF_TEXT if (i := tok.token_to_id(name)) is not None), None)
    ids: list[int] = []
    for encoding in tok.encode_batch(texts, add_special_tokens=False):
        ids += encoding.ids
        if end is not None:
            ids.append(end)
    return np.asarray(ids, dtype=np.int32)


def _jsonl(path: Path, field: str) -> list[str]:
    """Every line's ``field``."""
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)[field]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"spec.data.path {str(path)!r} line {line_no}: not a JSON object with a string {field!r} "
                    f"({type(exc).__name__}: {exc}); fix the line or set spec.data.textField"
                ) from None
            if not isinstance(text, str):
                raise ValueError(
                    f"spec.data.path {str(path)!r} line {line_no}: {field!r} is a {type(text).__name__}, not text; "
                    "fix the line or set spec.data.textField"
                )
            texts.append(text)
    return texts


def _parquet(path: Path, column: str) -> list[str]:
    """The text column of a Parquet file (pyarrow; only that column is read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            "spec.data.source parquet needs pyarrow: use the trainer image, or install pipefill-operator[trainer,data]"
        ) from None
    schema = pq.read_schema(path)
    if column not in schema.names:
        raise ValueError(
            f"spec.data.path {str(path)!r} has no column {column!r} (columns: {', '.join(schema.names)}); "
            "set spec.data.textField to the text column"
        )
    values: list[str] = pq.read_table(path, columns=[column]).column(column).to_pylist()
    bad = next(((i, v) for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise ValueError(
            f"spec.data.path {str(path)!r} row {bad[0]}: column {column!r} holds a {type(bad[1]).__name__}, not "
            "text; set spec.data.textField to a string column"
        )
    return values
