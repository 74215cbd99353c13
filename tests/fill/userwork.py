"""A user-defined fill workload, as a user would write it (loaded by import path ``userwork:SquareSums``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from pipefill_fill.workload import Workload


class SquareSums(Workload):
    """Inference: for sample i, the sum of squares of a seeded random vector; ``dim`` from the parameters."""

    kind: ClassVar[str] = "inference"

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        self.dim = int(self.context.parameters.get("dim", 8))
        self.device = device
        self.next = self.context.start

    def step(self, batch_size: int) -> int:
        ids = np.arange(self.next, min(self.next + batch_size, self.context.end))
        gen = torch.Generator().manual_seed(1)
        x = torch.stack([torch.randn(self.dim, generator=gen.manual_seed(int(i))) for i in ids])
        self.context.emit(ids, (x * x).sum(1, keepdim=True).numpy())
        self.next += len(ids)
        return len(ids)

    def state(self) -> dict[str, Any]:
        return {"next": self.next}

    def restore(self, state: dict[str, Any]) -> None:
        self.next = state["next"]

    def done(self) -> bool:
        return self.next >= self.context.end


class NotAWorkload:
    kind: ClassVar[str] = "inference"

    def step(self, batch_size: int) -> int:
        return batch_size


class FromZero(SquareSums):
    """A workload written before slices existed: it starts at sample 0 whatever slice it is given."""

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        super().setup(device, memory_budget_bytes)
        self.next = 0


class EndsEarly(SquareSums):
    """A workload whose done() is wrong: it says done four samples into its slice."""

    def done(self) -> bool:
        return self.next >= self.context.start + 4
