"""The wrappers: what the hook replaces in ``torch.distributed.pipelining`` and ``torch.distributed``.

- every schedule class's ``step`` (the outermost call only; ``eval`` steps without backward are left alone): the
  training step's start and end, and its ``losses`` list;
- ``_PipelineStageBase.forward_one_chunk``, ``backward_one_chunk`` (``B``, or ``I`` with ``full_backward=False``),
  ``backward_weight_one_chunk`` (``W``): this rank's compute actions (on a GPU, drained before and after while the
  step is profiled, so their spans are the device's);
- ``schedules._wait_batch_p2p``: every point-to-point wait of a schedule (the name is private: the version check in
  :mod:`pipefill_hook.version` guards it);
- ``torch.distributed.all_reduce`` and ``barrier``, blocking calls only, and only the first after ``step`` returned:
  the end-of-step wait.

Each wrapper calls the original with the same arguments and returns its result: the training computes exactly what
it computes without the hook. What a wrapper does besides the call it wraps is the hook's own time
(``Session.own_ns``, each step's ``hook_s`` in the event log): what the hook adds to the rank's step, which
``pipefill bench hook`` reports beside the step times it compares. On CUDA a wait means the GPU's idle time, as in the trainer
(:mod:`pipefill_trainer.devsync`): the bubble begins once the compute stream has run all queued work while the
transfer is still pending, and ends when it completed on the device (a blocking all-reduce is issued as
``async_op=True`` and waited, which is what it does anyway). What is not seen: collectives inside a step (FSDP,
tensor parallel), functional collectives (``torch.distributed._functional_collectives``) and a name imported before
the hook (``from torch.distributed import all_reduce``).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pipefill.schedules.model import Kind
from pipefill_hook.session import Session, warn
from pipefill_trainer.devsync import BlockingSync, DeviceSync, device_sync

__all__ = ["apply", "session"]

_state: dict[str, Any] = {"session": None, "sync": BlockingSync(), "applied": False}
_local = threading.local()


def session() -> Session | None:
    """The process's session (None before :func:`apply`)."""
    s: Session | None = _state["session"]
    return s


class _Works:
    """Works in flight as :class:`pipefill_trainer.devsync.Pending`: done when all completed; ``wait`` the original
    call."""

    __slots__ = ("_finish", "works")

    def __init__(self, works: list[Any], finish: Callable[[], Any]) -> None:
        self.works, self._finish = works, finish

    def done(self) -> bool:
        return all(w.is_completed() for w in self.works) if self.works else False

    def wait(self) -> Any:
        return self._finish()


def _timed(s: Session, idx: int, pending: _Works, sync: DeviceSync, entered_ns: int) -> Any:
    """Wait for ``pending`` as the original call would, measured (and announced) as the wait before ``idx``; the
    hook's own time from ``entered_ns`` (the wrapper's entry) on, less the wait, is added to the session's."""
    if pending.works and pending.done():
        s.own_ns += time.monotonic_ns() - entered_ns
        return pending.wait()  # arrived already: no wait
    if not sync.idle_before(pending):
        s.own_ns += time.monotonic_ns() - entered_ns
        return pending.wait()  # completed before the device ran out of work: no bubble
    books_ns = s.wait_ns
    try:
        start = s.wait_begin(idx, pending.done)
    except Exception as exc:
        s.disable(exc)
        return pending.wait()
    s.own_ns += time.monotonic_ns() - entered_ns - (s.wait_ns - books_ns)  # the books written in the wait: not own
    try:
        return sync.wait(pending)
    finally:
        after = time.monotonic_ns()
        try:
            s.wait_end(idx, start)
        except Exception as exc:
            s.disable(exc)
        s.own_ns += time.monotonic_ns() - after


def _wait_index(s: Session | None) -> int | None:
    if s is None or not s.started or s.disabled or getattr(_local, "quiet", False):
        return None
    return s.wait_index()


def _wrap_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        entered = time.monotonic_ns()
        s = session()
        idx = _wait_index(s)
        if s is None or idx is None:
            return orig(work, *args, **kwargs)
        works = list(work)
        return _timed(s, idx, _Works(works, lambda: orig(works, *args, **kwargs)), _state["sync"], entered)

    return wait


def _wrap_collective(orig: Callable[..., Any], *, device_aware: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def collective(*args: Any, **kwargs: Any) -> Any:
        entered = time.monotonic_ns()
        s = session()
        idx = _wait_index(s)
        if s is None or idx is None or not s.end_wait_pending or kwargs.get("async_op") or len(args) >= 4:
            return orig(*args, **kwargs)
        sync: DeviceSync = _state["sync"]
        if device_aware and not isinstance(sync, BlockingSync):
            s.own_ns += time.monotonic_ns() - entered
            work = orig(*args, **{**kwargs, "async_op": True})
            return _timed(s, idx, _Works([work], lambda: _wait_none(work)), sync, time.monotonic_ns())
        return _timed(s, idx, _Works([], lambda: orig(*args, **kwargs)), BlockingSync(), entered)

    return collective


def _wait_none(work: Any) -> None:
    """A blocking collective's result: None, once its work is done."""
    work.wait()


def _wrap_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        entered = time.monotonic_ns()
        s = session()
        nested = bool(getattr(_local, "depth", 0))
        if s is None or s.disabled or nested or not getattr(self, "_has_backward", True):
            return orig(self, *args, **kwargs)
        stages = list(getattr(self, "_stages", None) or [self._stage])
        try:
            if not s.started:
                first = stages[0]
                s.start(stage_idx=first.stage_index, num_stages=first.num_stages, device=first.device)
                _state["sync"] = _sync_for(first.device)
            s.step_begin()
        except Exception as exc:
            s.disable(exc)
        _local.depth = 1
        s.own_ns += time.monotonic_ns() - entered
        try:
            out = orig(self, *args, **kwargs)
        finally:
            _local.depth = 0
        after = time.monotonic_ns()
        pp_rank = getattr(self, "rank", None)
        if pp_rank is None:
            pp_rank = stages[0].group_rank
        _local.quiet = True  # the profile exchange's own collectives are not the step's end
        try:
            s.step_end(kwargs.get("losses"), pp_rank=int(pp_rank), sched=self)
        except Exception as exc:
            s.disable(exc)
        finally:
            _local.quiet = False
        s.own_ns += time.monotonic_ns() - after
        return out

    return step


def _sync_for(device: torch.device) -> DeviceSync:
    try:
        return device_sync(device)
    except ValueError:
        return BlockingSync()


class _Args:
    """Reads one argument of a call of ``fn`` by name, as binding would, without binding: ``inspect``'s bind with its
    defaults costs 15–35 µs a call, up to a millisecond of a step at 16–32 compute calls, which the hook must not
    add to the training."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        params = list(inspect.signature(fn).parameters.values())
        self.first = params[1].name  # the microbatch: the first parameter after self
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._at = {p.name: i - 1 for i, p in enumerate(params) if i and p.kind in positional}  # in args (no self)
        self._default = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, missing: Any = None) -> Any:
        if name in kwargs:
            return kwargs[name]
        at = self._at.get(name)
        if at is not None and at < len(args):
            return args[at]
        return self._default.get(name, missing)


def _wrap_compute(orig: Callable[..., Any], kind_of: Callable[[Callable[[str, Any], Any]], Kind]) -> Any:
    reader = _Args(orig)

    @functools.wraps(orig)
    def compute(self: Any, *args: Any, **kwargs: Any) -> Any:
        entered = time.monotonic_ns()
        s = session()
        if s is None or s.disabled or not s.in_step:
            return orig(self, *args, **kwargs)
        sync: DeviceSync = _state["sync"]
        exact = s.announcer is None and not isinstance(sync, BlockingSync)  # profiling on a GPU: device spans
        if exact:
            sync.drain()
        s.compute_begin()
        s.own_ns += time.monotonic_ns() - entered
        out = orig(self, *args, **kwargs)
        after = time.monotonic_ns()
        if exact:
            sync.drain()
        kind = kind_of(lambda name, missing: reader.get(args, kwargs, name, missing))
        s.compute_end(int(self.stage_index), kind, int(reader.get(args, kwargs, reader.first)))
        s.own_ns += time.monotonic_ns() - after
        return out

    return compute


def _backward_kind(arg: Callable[[str, Any], Any]) -> Kind:
    return Kind.B if arg("full_backward", True) else Kind.I


def apply(schedules: Any, new_session: Callable[[], Session]) -> bool:
    """Wrap the names above once; False (and a warning) when this torch lacks one of them (nothing is wrapped)."""
    if _state["applied"]:
        return True
    stage_mod = getattr(schedules, "_PipelineStageBase", None)
    base = getattr(schedules, "_PipelineSchedule", None)
    names = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    if (
        stage_mod is None
        or base is None
        or not callable(getattr(schedules, "_wait_batch_p2p", None))
        or not all(callable(getattr(stage_mod, n, None)) for n in names)
    ):
        warn(f"torch {torch.__version__} lacks the pipelining internals the hook wraps; nothing is instrumented")
        return False
    _state["session"] = new_session()
    schedules._wait_batch_p2p = _wrap_wait(schedules._wait_batch_p2p)
    for cls in [base, *_subclasses(base)]:
        if "step" in vars(cls):
            cls.step = _wrap_step(vars(cls)["step"])
    stage_mod.forward_one_chunk = _wrap_compute(stage_mod.forward_one_chunk, lambda b: Kind.F)
    stage_mod.backward_one_chunk = _wrap_compute(stage_mod.backward_one_chunk, _backward_kind)
    stage_mod.backward_weight_one_chunk = _wrap_compute(stage_mod.backward_weight_one_chunk, lambda b: Kind.W)
    for module in (dist.distributed_c10d, dist):  # each as it is bound now (the user's own wrapper stays inside)
        for name, device_aware in (("all_reduce", True), ("barrier", False)):
            setattr(module, name, _wrap_collective(getattr(module, name), device_aware=device_aware))
    _state["applied"] = True
    return True


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out
