"""``train-classifier``: trains an MLP classifier on a dataset file, with periodic checkpoints and a final model.

Parameters (spec.workload.parameters): ``features`` (32), ``hidden`` (256), ``classes`` (10), ``batchSize`` (32),
``learningRate`` (1e-3), ``checkpointEverySteps`` (100), ``seed`` (0). Work is counted in optimizer steps
(spec.totalSteps) or in samples (spec.totalSamples). Batches walk a per-epoch permutation derived from the seed and the
epoch number, so the data order is a function of the position alone and a resumed run sees the same batches.

Checkpoints are the executor's commits (``checkpoints/state-<n>.pt``); ``finalize`` writes ``model.pt`` (weights) and
``metrics.json`` (final loss and accuracy on the first 1024 samples), both atomically.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from pipefill_fill.atomic import atomic_write
from pipefill_fill.builtins.datasets import classification_dataset, open_dataset
from pipefill_fill.pieces import PieceSteps
from pipefill_fill.workload import Workload, WorkloadContext

__all__ = ["TrainClassifier"]


class TrainClassifier(PieceSteps, Workload):
    """Partial steps (:mod:`pipefill_fill.pieces`): four pieces per batch — the first layer forward, the second and
    the loss, the backward of the second, the backward of the first and the optimizer step (the weights change in the
    last piece only, so ``state()`` is the last whole step's until then)."""

    kind: ClassVar[str] = "training"

    def __init__(self, context: WorkloadContext) -> None:
        super().__init__(context)
        p = context.param
        self.features = p("features", 32, int)
        self.hidden = p("hidden", 256, int)
        self.classes = p("classes", 10, int)
        self.batch_size = p("batchSize", 32, int)
        self.lr = p("learningRate", 1e-3, float)
        self.commit_every = p("checkpointEverySteps", 100, int)
        self.seed = p("seed", 0, int)
        self.dataset_samples = p("datasetSamples", 8192, int)
        for name, value in (("hidden", self.hidden), ("classes", self.classes), ("batchSize", self.batch_size)):
            if value < 1:
                raise ValueError(f"spec.workload.parameters.{name}: {value} must be ≥ 1")
        if self.commit_every < 1:
            raise ValueError(f"spec.workload.parameters.checkpointEverySteps: {self.commit_every} must be ≥ 1")
        if not context.counts_steps:
            self.commit_every *= self.batch_size  # work is counted in samples
        self.steps = 0
        self.samples = 0
        self.last_loss = float("nan")
        self.device = torch.device("cpu")
        self.model: nn.Sequential | None = None
        self.opt: torch.optim.Adam | None = None
        self.data: np.ndarray | None = None

    def batch_sizes(self) -> list[int]:
        return [self.batch_size]  # the batch is part of the training recipe; the plan only picks steps per bubble

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        ctx = self.context
        if ctx.input_path is not None:
            self.data = open_dataset(ctx.input_path)
            names = self.data.dtype.names or ()
            if self.data.ndim != 1 or "x" not in names or "y" not in names:
                raise ValueError(
                    f"spec.input.path: {str(ctx.input_path)!r} holds {self.data.dtype} {self.data.shape}; "
                    "train-classifier needs a structured (N,) array with fields x (float32, D) and y (int64)"
                )
            self.features = int(self.data.dtype["x"].shape[0])
        else:
            name = f"dataset-clf-{self.dataset_samples}x{self.features}-c{self.classes}-s{self.seed}.npy"
            self.data = classification_dataset(
                ctx.output_dir / name,
                samples=self.dataset_samples,
                features=self.features,
                classes=self.classes,
                seed=self.seed,
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = nn.Sequential(
                nn.Linear(self.features, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.classes)
            )
        state_bytes = 4 * sum(t.numel() * t.element_size() for t in model.parameters())  # weights, grads, Adam m and v
        if state_bytes > memory_budget_bytes:
            raise ValueError(
                f"spec.workload.parameters.hidden: the classifier's training state needs {state_bytes} bytes, more than "
                f"the fill's memory budget ({memory_budget_bytes}); make hidden smaller or raise spec.fill.reservedMemory"
            )
        self.device = device
        self.model = model.to(device).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def _indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices ``start .. start+count`` of the endless stream of per-epoch permutations."""
        n = len(self.data) if self.data is not None else 0
        out = []
        while count > 0:
            epoch, offset = divmod(start, n)
            perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(n)
            take = min(count, n - offset)
            out.append(perm[offset : offset + take])
            start, count = start + take, count - take
        return np.sort(np.concatenate(out)) if out else np.empty(0, dtype=np.int64)

    def step(self, batch_size: int) -> int:
        if self.model is None or self.opt is None or self.data is None:
            raise RuntimeError("TrainClassifier.step called before setup")
        if self.done():
            return 0
        rows = self.data[self._indices(self.samples, batch_size)]
        x = torch.from_numpy(np.ascontiguousarray(rows["x"], dtype=np.float32)).to(self.device)
        y = torch.from_numpy(np.ascontiguousarray(rows["y"], dtype=np.int64)).to(self.device)
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self.opt.step()
        self.last_loss = float(loss.detach())
        self.steps += 1
        self.samples += batch_size
        return 1 if self.context.counts_steps else batch_size

    def pieces(self, batch_size: int) -> int:
        return 4

    def start_batch(self, batch_size: int) -> dict[str, Any] | None:
        if self.model is None or self.opt is None or self.data is None:
            raise RuntimeError("TrainClassifier.start_batch called before setup")
        if self.done():
            return None
        rows = self.data[self._indices(self.samples, batch_size)]
        x = torch.from_numpy(np.ascontiguousarray(rows["x"], dtype=np.float32)).to(self.device)
        y = torch.from_numpy(np.ascontiguousarray(rows["y"], dtype=np.int64)).to(self.device)
        return {"x": x, "y": y, "batch_size": batch_size}

    def run_piece(self, carry: dict[str, Any], index: int) -> dict[str, Any]:
        assert self.model is not None and self.opt is not None  # for mypy: start_batch checked
        first, relu, second = self.model
        if index == 0:  # forward of the first layer; its graph stays for piece 3
            carry["h"] = relu(first(carry["x"]))
        elif index == 1:  # forward of the second from a cut of the graph, and the loss
            carry["h_in"] = carry["h"].detach().requires_grad_()
            carry["loss"] = F.cross_entropy(second(carry["h_in"]), carry["y"])
        elif index == 2:  # backward of the second layer: its gradients, and the one of its input
            self.opt.zero_grad(set_to_none=True)
            carry["loss"].backward()
        else:  # backward of the first layer from there, then the optimizer step
            carry["h"].backward(carry["h_in"].grad)
            self.opt.step()
        return carry

    def finish_batch(self, carry: dict[str, Any]) -> int:
        self.last_loss = float(carry["loss"].detach())
        self.steps += 1
        self.samples += carry["batch_size"]
        return 1 if self.context.counts_steps else int(carry["batch_size"])

    def _progress(self) -> int:
        return self.steps if self.context.counts_steps else self.samples

    def state(self) -> dict[str, Any]:
        if self.model is None or self.opt is None:
            raise RuntimeError("TrainClassifier.state called before setup")
        clone = _clone_to_cpu
        return {
            "steps": self.steps,
            "samples": self.samples,
            "last_loss": self.last_loss,
            "model": clone(self.model.state_dict()),
            "optimizer": clone(self.opt.state_dict()),
        }

    def restore(self, state: dict[str, Any]) -> None:
        if self.model is None or self.opt is None:
            raise RuntimeError("TrainClassifier.restore called before setup")
        self.drop_in_flight()
        self.steps, self.samples = int(state["steps"]), int(state["samples"])
        self.last_loss = float(state["last_loss"])
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])

    def done(self) -> bool:
        return self._progress() >= self.context.total

    def modules(self) -> list[torch.nn.Module | torch.optim.Optimizer]:
        return [m for m in (self.model, self.opt) if m is not None]

    def finalize(self) -> None:
        if self.model is None or self.data is None:
            raise RuntimeError("TrainClassifier.finalize called before setup")
        out = self.context.output_dir
        weights = _clone_to_cpu(self.model.state_dict())
        atomic_write(out / "model.pt", lambda f: torch.save(weights, f))
        with torch.no_grad():
            rows = self.data[: min(1024, len(self.data))]
            x = torch.from_numpy(np.ascontiguousarray(rows["x"], dtype=np.float32)).to(self.device)
            y = torch.from_numpy(np.ascontiguousarray(rows["y"], dtype=np.int64)).to(self.device)
            logits = self.model(x)
            summary = {
                "steps": self.steps,
                "samples": self.samples,
                "loss": float(F.cross_entropy(logits, y)),
                "accuracy": float((logits.argmax(1) == y).float().mean()),
            }
        atomic_write(out / "metrics.json", lambda f: f.write(json.dumps(summary, indent=2).encode()))


def _clone_to_cpu(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU, so later steps cannot change a snapshot."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _clone_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone_to_cpu(v) for v in obj)
    return obj
