"""The workload SDK: what a fill job's code implements so the executor can run it inside bubbles.

A workload is a class named by a builtin name, an entry point of an installed package or an import path
(``package.module:Class``), whose module may come from the fill storage or a ConfigMap (:mod:`pipefill_fill.usercode`
loads it and checks this contract: :func:`check_workload_class`). The executor constructs it
with a :class:`WorkloadContext`, then calls ``setup(device, memory_budget_bytes)`` once, ``step(batch_size)`` as long as
a bubble has time for it, ``state()`` at every commit and ``restore(state)`` after a restart. See docs/fill.md.

Rules a workload must keep for the exactly-once guarantee:

* ``step`` does a bounded amount of work (one batch) and returns the units of work it completed (samples, or 1 for a
  training job counted in steps); inference workloads pass their outputs to ``context.emit(sample_ids, values)``.
* an inference workload works on samples ``[context.start, context.end)``: it starts at ``context.start`` and is
  done at ``context.end`` (a slice of the job when it is split across ranks; the whole job otherwise).
* ``state()`` returns a snapshot (tensors, numbers, lists) that later steps do not change; ``restore(state)`` puts the
  workload back exactly there, so that the same steps afterwards give byte-identical outputs.
* ``done()`` says whether all work is done.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from pipefill.usercode import import_installed

__all__ = [
    "BUILTINS",
    "SampleWorkload",
    "Workload",
    "WorkloadContext",
    "WorkloadProtocol",
    "check_workload_class",
    "load_workload_class",
    "split_import_path",
]

# builtin name -> import path
BUILTINS: dict[str, str] = {
    "encoder-inference": "pipefill_fill.builtins.encoder:EncoderInference",
    "train-classifier": "pipefill_fill.builtins.classifier:TrainClassifier",
    "sentence-embedding": "pipefill_fill.builtins.sentences:SentenceEmbedding",
}

Emit = Callable[[np.ndarray, np.ndarray], None]


def _drop(sample_ids: np.ndarray, values: np.ndarray) -> None:
    del sample_ids, values


@dataclass
class WorkloadContext:
    """What the executor tells a workload: its parameters, data and where it may write.

    ``total``: units of work the job asks for (spec.totalSamples or spec.totalSteps); ``start``, ``end``: the slice
    of ``[0, total)`` this workload works on — an inference job split across ranks (spec.maxParallelRanks > 1) gives
    each executor one slice at a time, otherwise the whole job; ``input_path``: the dataset file (None: a builtin makes
    a synthetic one); ``output_dir``: the job's output directory (the executor owns ``slices.json``, ``slices/``,
    ``chunks/``, ``checkpoints/``, ``progress.json`` and ``outputs.npy`` in it; a workload may write
    other files there, atomically, and must expect other executors' workloads doing the same);
    ``counts_steps``: True when ``total`` is in optimizer steps (spec.totalSteps).
    """

    name: str
    parameters: dict[str, Any]
    total: int
    output_dir: Path
    input_path: Path | None = None
    counts_steps: bool = False
    start: int = 0
    end: int = -1  # -1: total
    emit_fn: Emit = field(default=_drop, repr=False)

    def __post_init__(self) -> None:
        if self.end < 0:
            self.end = self.total

    def emit(self, sample_ids: np.ndarray, values: np.ndarray) -> None:
        """Hand outputs to the executor: ``sample_ids`` (N,) int64 consecutive from the last one, ``values`` (N, ...)."""
        self.emit_fn(sample_ids, values)

    def param(self, name: str, default: Any, kind: type) -> Any:
        """A parameter from spec.workload.parameters, with an error naming it when it has the wrong type."""
        value = self.parameters.get(name, default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise ValueError(
                f"spec.workload.parameters.{name}: {value!r} must be of type {kind.__name__} (default {default!r})"
            )
        return value


@runtime_checkable
class WorkloadProtocol(Protocol):
    """The methods the executor calls. Subclass :class:`Workload` or implement these (with ``kind``) directly."""

    kind: ClassVar[str]

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None: ...

    def step(self, batch_size: int) -> int: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def done(self) -> bool: ...


class Workload:
    """Base class with the optional parts filled in; override the five protocol methods and set ``kind``.

    Optional hooks: ``batch_sizes()`` (candidates the profiler measures), ``commit_every`` (units of work between
    commits: the checkpoint cadence of training; None: at most once a second), ``modules()`` (the modules and optimizers
    whose state offload mode moves to host memory between bubbles), ``finalize()`` (called once after the last commit;
    must be idempotent, e.g. write the final model atomically), ``reuse(previous)`` (called before ``setup`` with the
    instance of the last slice or job of the same workload — same code and parameters — this executor set up on the
    same device: take what does not depend on the slice, such as inference weights, so ``setup`` need not build it
    again; never share what steps change, such as a training model or an optimizer). Partial steps (a step run in
    pieces, a layer of one batch at a time: :mod:`pipefill_fill.pieces`) are a mixin of their own, ``PieceSteps``.
    """

    kind: ClassVar[str] = "inference"
    commit_every: int | None = None

    def __init__(self, context: WorkloadContext) -> None:
        self.context = context

    def setup(self, device: torch.device, memory_budget_bytes: int) -> None:
        raise NotImplementedError

    def step(self, batch_size: int) -> int:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def batch_sizes(self) -> list[int]:
        sizes = self.context.param("batchSizes", [1, 2, 4, 8, 16, 32, 64], list)
        if not sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes):
            raise ValueError(f"spec.workload.parameters.batchSizes: {sizes!r} must be a non-empty list of integers ≥ 1")
        return sorted(set(sizes))

    def modules(self) -> list[torch.nn.Module | torch.optim.Optimizer]:
        return []

    def finalize(self) -> None:
        return None


class SampleWorkload(Workload):
    """Base of an inference workload that goes through its samples in order: ``take(batch_size)`` gives the next
    ``[start, end)`` of its slice and advances, and the position is the state (``next_sample``)."""

    def __init__(self, context: WorkloadContext) -> None:
        super().__init__(context)
        self.next_sample = context.start  # this executor's slice of the samples: [context.start, context.end)

    def take(self, batch_size: int) -> tuple[int, int]:
        """The next at most ``batch_size`` samples, ``[start, end)``; empty when the slice is done."""
        start, end = self.peek(batch_size)
        self.next_sample = end
        return start, end

    def peek(self, batch_size: int) -> tuple[int, int]:
        """What :meth:`take` would give, without advancing (a batch run in pieces advances when it completes)."""
        start = self.next_sample
        return start, max(start, min(start + batch_size, self.context.end))

    def state(self) -> dict[str, Any]:
        return {"next_sample": self.next_sample}

    def restore(self, state: dict[str, Any]) -> None:
        self.next_sample = int(state["next_sample"])

    def done(self) -> bool:
        return self.next_sample >= self.context.end


# method -> the arguments the executor passes it (besides self)
_CONTRACT: dict[str, tuple[Any, ...]] = {
    "setup": (torch.device("cpu"), 0),
    "step": (1,),
    "state": (),
    "restore": ({},),
    "done": (),
}


def check_workload_class(cls: object, *, what: str, field: str, kind: str) -> type:
    """``cls`` if it keeps the workload protocol's contract (a class, the five methods taking the arguments the
    executor passes, the declared ``kind``); else a ValueError naming ``field`` (``spec.workload.importPath`` …),
    ``what`` (its value) and the fix."""
    if not isinstance(cls, type):
        raise ValueError(f"{field}: {what} is a {type(cls).__name__}, not a class; point it at the workload class")
    missing = [m for m in _CONTRACT if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{field}: {what} lacks {missing}; see the workload SDK in docs/fill.md")
    for method, args in _CONTRACT.items():
        try:
            inspect.signature(getattr(cls, method)).bind(None, *args)
        except TypeError:
            sig = inspect.signature(getattr(cls, method))
            raise ValueError(
                f"{field}: {what}: {method}{sig} does not take the arguments the executor passes "
                f"({method}(self{''.join(', ' + type(a).__name__ for a in args)})); see the workload SDK in docs/fill.md"
            ) from None
        except ValueError:  # no signature (a builtin or C method): nothing to check
            continue
    try:
        inspect.signature(cls).bind(WorkloadContext(name="check", parameters={}, total=1, output_dir=Path(".")))
    except TypeError:
        raise ValueError(
            f"{field}: {what}: its constructor must take the WorkloadContext alone ({cls.__name__}(context)); "
            "see the workload SDK in docs/fill.md"
        ) from None
    except ValueError:
        pass
    declared = getattr(cls, "kind", None)
    if str(declared) != kind:
        raise ValueError(f"spec.workload.kind: {kind!r} but {what} declares kind {declared!r}; set kind: {declared}")
    return cls


def load_workload_class(*, builtin: str | None, import_path: str | None, kind: str) -> type:
    """The workload class of a builtin or an import path in the fill image; errors name the field, the value and what
    to fix. (Entry points and code from the fill storage or a ConfigMap: :mod:`pipefill_fill.usercode`.)"""
    if (builtin is None) == (import_path is None):
        raise ValueError("spec.workload: set exactly one of builtin, entryPoint and importPath")
    field_name = "builtin" if builtin is not None else "importPath"
    if builtin is not None:
        if builtin not in BUILTINS:
            raise ValueError(f"spec.workload.builtin: {builtin!r} is not a builtin; use one of {sorted(BUILTINS)}")
        import_path = BUILTINS[builtin]
    assert import_path is not None  # for mypy: set just above
    module_name, attr = split_import_path(import_path)
    spec_field = f"spec.workload.{field_name}"
    cls = import_installed(module_name, attr, field=spec_field, noun="class", image="fill image")
    return check_workload_class(cls, what=repr(import_path), field=spec_field, kind=kind)


def split_import_path(import_path: str) -> tuple[str, str]:
    """``package.module:Class`` → (module, class name)."""
    module_name, sep, attr = import_path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"spec.workload.importPath: {import_path!r} must look like package.module:Class")
    return module_name, attr
