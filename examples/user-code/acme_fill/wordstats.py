"""``word-stats``: for each line of a text file (spec.input.path; line i is sample i), its number of words, its number
of characters and its mean word length, as float32 ``(3,)``. A workload as a user writes it: the workload SDK's
``SampleWorkload`` walks the executor's slice of samples and keeps the position as the state."""

from __future__ import annotations

import itertools
from typing import ClassVar

import numpy as np
import torch

from pipefill_fill.workload import SampleWorkload


class WordStats(SampleWorkload):
    kind: ClassVar[str] = "inference"

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        if self.context.input_path is None:
            raise ValueError("spec.input.path: word-stats reads a text file, one sample per line; set input.path")
        with self.context.input_path.open(encoding="utf-8") as f:
            self.lines = [line.rstrip("\n") for line in itertools.islice(f, self.context.start, self.context.end)]
        if len(self.lines) < self.context.end - self.context.start:
            raise ValueError(f"spec.input.path: fewer lines than totalSamples ({self.context.total})")

    def step(self, batch_size: int) -> int:
        start, end = self.take(batch_size)
        rows = []
        for line in self.lines[start - self.context.start : end - self.context.start]:
            words = line.split()
            rows.append([len(words), len(line), sum(map(len, words)) / max(1, len(words))])
        self.context.emit(np.arange(start, end, dtype=np.int64), np.asarray(rows, dtype=np.float32).reshape(-1, 3))
        return end - start
