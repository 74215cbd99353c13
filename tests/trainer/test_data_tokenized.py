"""spec.data.source jsonl and parquet: each document (a line's field, a column's value) tokenized with a Hugging Face
tokenizer.json (the tokenizers library), packed into one stream with the end-of-text token between documents; bad
input named by field, line or row, and fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from pipefill.spec.training import Data, DataSource
from pipefill_trainer.data import TokenSource

WORDS = ["<|endoftext|>", "[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
DOCS = ["the cat sat on the mat", "a dog ran", "the dog sat"]


def _tokenizer(tmp: Path) -> Path:
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return path


def _source(tmp: Path, lines: list[str], *, tokenizer: Path | None, field: str = "text") -> TokenSource:
    data = tmp / "docs.jsonl"
    data.write_text("\n".join(lines) + "\n")
    spec = Data(source=DataSource.JSONL, path=str(data), text_field=field)
    return TokenSource(spec, vocab_size=len(WORDS), seq_len=4, replica_batch=2, replicas=1, tokenizer=tokenizer)


def test_documents_are_tokenized_and_packed_with_the_end_of_text_token_between(tmp_path: Path) -> None:
    source = _source(
        tmp_path, [json.dumps({"text": d, "id": i}) for i, d in enumerate(DOCS)], tokenizer=_tokenizer(tmp_path)
    )
    stream = [WORDS.index(w) for doc in DOCS for w in [*doc.split(), "<|endoftext|>"]]
    assert source._tokens is not None and source._tokens.tolist() == stream
    tokens, targets = source.batch(3, dp_rank=0)  # (N, T) windows of the stream, targets shifted by one
    assert tokens.shape == (2, 4)
    text = " ".join(map(str, stream))
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        assert " ".join(map(str, [*row, target[-1]])) in text and row[1:] == target[:-1]
    again, _ = source.batch(3, dp_rank=0)
    assert np.array_equal(tokens.numpy(), again.numpy())  # the data position is the step


def test_a_missing_tokenizer_or_a_bad_line_is_named(tmp_path: Path) -> None:
    good = [json.dumps({"text": d}) for d in DOCS]
    with pytest.raises(ValueError, match=r"source jsonl needs a tokenizer: .*; set spec.data.tokenizer"):
        _source(tmp_path, good, tokenizer=tmp_path / "nothere.json")
    tok = _tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"line 2: not a JSON object with a string 'text' .*set spec.data.textField"):
        _source(tmp_path, [good[0], json.dumps({"body": "x"})], tokenizer=tok)
    with pytest.raises(ValueError, match=r"line 1: 'text' is a int, not text"):
        _source(tmp_path, [json.dumps({"text": 3})], tokenizer=tok)
    assert _source(tmp_path, [json.dumps({"body": d}) for d in DOCS], tokenizer=tok, field="body")._tokens is not None


def test_a_parquet_text_column_is_tokenized_and_packed_like_json_lines(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tok = _tokenizer(tmp_path)
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "body": DOCS}), path)
    spec = Data(source=DataSource.PARQUET, path=str(path), text_field="body")
    source = TokenSource(spec, vocab_size=len(WORDS), seq_len=4, replica_batch=2, replicas=1, tokenizer=tok)
    jsonl = _source(tmp_path, [json.dumps({"text": d}) for d in DOCS], tokenizer=tok)
    assert source._tokens is not None and jsonl._tokens is not None
    assert source._tokens.tolist() == jsonl._tokens.tolist()
    with pytest.raises(ValueError, match=r"has no column 'text' \(columns: id, body\); set spec.data.textField"):
        TokenSource(Data(source=DataSource.PARQUET, path=str(path)), vocab_size=10, seq_len=4, replica_batch=2,
                    replicas=1, tokenizer=tok)  # fmt: skip
    with pytest.raises(ValueError, match=r"row 0: column 'id' holds a int, not text"):
        TokenSource(Data(source=DataSource.PARQUET, path=str(path), text_field="id"), vocab_size=10, seq_len=4,
                    replica_batch=2, replicas=1, tokenizer=tok)  # fmt: skip
