"""Dataset files of the builtin workloads: memory-mapped ``.npy``, synthetic and deterministic when none is given.

* tokens: ``(N, T)`` uint16, 0 is padding (each row has 1..T real tokens, then padding).
* classification: a structured ``(N,)`` array with fields ``x`` (float32, D) and ``y`` (int64 label).
* sentences: a UTF-8 text file, one sentence per line, from a small seeded grammar.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipefill_fill.atomic import atomic_write

__all__ = ["classification_dataset", "open_dataset", "sentence_corpus", "token_dataset"]


def open_dataset(path: Path, *, field: str = "spec.input.path") -> np.ndarray:
    """A read-only memory map of an ``.npy`` dataset file."""
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise ValueError(
            f"{field}: {str(path)!r} does not exist; point it at an .npy dataset or leave input unset"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{field}: {str(path)!r} is not an .npy array file ({exc})") from None
    if not isinstance(data, np.ndarray):
        raise ValueError(f"{field}: {str(path)!r} must hold one array, not an archive")
    return data


def token_dataset(path: Path, *, samples: int, seq_len: int, vocab: int, seed: int) -> np.ndarray:
    """Make (once) and open a synthetic token dataset of ``samples`` rows."""
    if not path.exists():
        rng = np.random.Generator(np.random.PCG64(seed))
        tokens = rng.integers(1, vocab, size=(samples, seq_len), dtype=np.uint16)
        lengths = rng.integers(1, seq_len + 1, size=samples)
        tokens[np.arange(seq_len)[None, :] >= lengths[:, None]] = 0
        atomic_write(path, lambda f: np.save(f, tokens, allow_pickle=False))
    return open_dataset(path, field="synthetic dataset")


def classification_dataset(path: Path, *, samples: int, features: int, classes: int, seed: int) -> np.ndarray:
    """Make (once) and open a synthetic classification dataset: Gaussian clusters, one centre per class."""
    if not path.exists():
        rng = np.random.Generator(np.random.PCG64(seed))
        centres = rng.normal(0.0, 1.0, size=(classes, features)).astype(np.float32)
        labels = rng.integers(0, classes, size=samples)
        data = np.empty(samples, dtype=[("x", "<f4", (features,)), ("y", "<i8")])
        data["x"] = centres[labels] + rng.normal(0.0, 0.7, size=(samples, features)).astype(np.float32)
        data["y"] = labels
        atomic_write(path, lambda f: np.save(f, data, allow_pickle=False))
    return open_dataset(path, field="synthetic dataset")


_WHO = ("the engineer", "a small bird", "the old captain", "my neighbour", "the children", "a tired baker")
_DOES = ("repairs", "paints", "watches", "carries", "forgets", "sells", "describes", "follows")
_WHAT = ("the red boat", "a wooden bridge", "the quiet garden", "an old map", "the bright lamp", "a letter")
_WHERE = ("", " at dawn", " near the river", " after the storm", " in the busy market", " every evening")


def sentence_corpus(path: Path, samples: int, seed: int) -> Path:
    """Make (once) a text file of ``samples`` seeded sentences, one per line; returns its path."""
    if not path.exists():
        rng = np.random.Generator(np.random.PCG64(seed))
        parts = [rng.integers(0, len(words), size=samples) for words in (_WHO, _DOES, _WHAT, _WHERE)]
        lines = [
            f"{_WHO[a].capitalize()} {_DOES[b]} {_WHAT[c]}{_WHERE[d]}.\n" for a, b, c, d in zip(*parts, strict=True)
        ]
        atomic_write(path, lambda f: f.write("".join(lines).encode()))
    return path
