"""Run one rank's action list of a pipeline schedule: F, B, I, W with explicit point-to-point transfers.

Every schedule — GPipe, 1F1B, interleaved, zero bubble, ZB-V, custom CSVs — is just a per-rank list of actions plus a
stage → rank placement, so one loop runs them all. Before an action that needs a peer's tensor the rank waits on a
receive posted ahead of time; that wait is the only place the rank idles inside a step, and the :class:`StepHooks`
are told right before it blocks and right after it resumes (where bubbles open and close).

Tensors between stages: what the model provider says (:meth:`~pipefill_trainer.provider.ModelProvider.activations`:
any number, each with its shape and dtype; our GPT sends one float32 (B, T, C)) forward, the gradients of those that
take one backward, each tensor one message in order. Each directed stage edge between two ranks is one stream (:mod:`pipefill_trainer.comm`); no tags. The receives of a stream are posted in the
order its sender sends (:func:`pipefill.schedules.validate.p2p_streams`), which is this rank's own consumption order
for every built-in schedule; a custom CSV that consumes in another order gets the earlier-sent receives posted ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from pipefill.schedules.model import Action, Kind, Schedule
from pipefill.schedules.validate import p2p_streams
from pipefill_trainer.comm import RecvHandle, Stream, Transport
from pipefill_trainer.devsync import DeviceSync, device_sync
from pipefill_trainer.model import WeightGradStore, set_grad_store
from pipefill_trainer.provider import ModelProvider, TensorMeta, check_outputs

__all__ = ["NoHooks", "PipelineExecutor", "StepHooks", "StepTiming"]


class StepHooks(Protocol):
    def wait_begin(self, action_idx: int) -> None:
        """The rank is about to block before action ``action_idx`` (``len(actions)``: the step end)."""

    def while_waiting(self, action_idx: int, done: Callable[[], bool]) -> None:
        """Between :meth:`wait_begin` and blocking: may poll ``done`` (whether the input arrived) for a while."""

    def wait_end(self, action_idx: int) -> None:
        """The wait before ``action_idx`` returned; must be cheap (no syscall)."""


class NoHooks:
    def wait_begin(self, action_idx: int) -> None:
        pass

    def while_waiting(self, action_idx: int, done: Callable[[], bool]) -> None:
        pass

    def wait_end(self, action_idx: int) -> None:
        pass


@dataclass
class StepTiming:
    """Monotonic ns of the last step: per action its compute span, and the blocked wait before it (0 if none).

    On CUDA the spans are the GPU's with ``run_step(exact_spans=True)``; without, a span is when the CPU queued the
    action, except that one after a blocking wait starts when the GPU had its input.
    """

    step_start_ns: int
    start_ns: list[int]
    end_ns: list[int]
    wait_ns: list[int]


Tensors = tuple[torch.Tensor, ...]


class _Received:
    """The receives of one action's tensors (one message each, posted in order on the action's stream)."""

    __slots__ = ("handles",)

    def __init__(self, handles: list[RecvHandle]) -> None:
        self.handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self) -> Tensors:
        return tuple(h.wait() for h in self.handles)


@dataclass
class _StepState:
    """What one step carries from action to action."""

    loss_sum: torch.Tensor
    handles: dict[int, _Received] = field(default_factory=dict)  # posted receives by consuming action
    next_post: int = 0  # index into the posting order
    saved: dict[tuple[int, int], tuple[Tensors, Tensors]] = field(default_factory=dict)  # F → B: inputs, outputs
    local_act: dict[tuple[int, int], Tensors] = field(default_factory=dict)  # same-rank hand-offs
    local_grad: dict[tuple[int, int], Tensors] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plan:
    recv_stream: Stream | None  # stream bringing the action's input (F) or output gradient (B/I) from another rank
    recv_src: int | None  # global rank it comes from (for failure messages)
    send_stream: Stream | None  # stream taking the output (F) or input gradient (B/I) to another rank


class PipelineExecutor:
    """Executes rank ``pp_rank``'s actions of ``schedule`` over ``stages`` (the stage modules this rank holds).

    ``pipeline_ranks[i]``: global rank of pipeline rank ``i`` in this data-parallel replica. ``provider``: the model's
    activations between stages and its loss; ``mb_size``: sequences per microbatch. ``prefetch``: a receive is posted ``2 × prefetch`` actions ahead of its first use.
    ``sync``: what a wait point means on the device (default: :func:`~pipefill_trainer.devsync.device_sync`).
    """

    def __init__(
        self,
        *,
        schedule: Schedule,
        pp_rank: int,
        stages: dict[int, nn.Module],
        pipeline_ranks: Sequence[int],
        transport: Transport,
        provider: ModelProvider,
        mb_size: int,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        prefetch: int = 4,
        sync: DeviceSync | None = None,
    ) -> None:
        self.schedule, self.pp_rank, self.stages = schedule, pp_rank, stages
        self.actions: tuple[Action, ...] = schedule.ranks[pp_rank]
        self.transport, self.device = transport, device
        self.sync: DeviceSync = sync if sync is not None else device_sync(device)
        self.provider, self.autocast_dtype, self.prefetch = provider, autocast_dtype, prefetch
        self.num_stages, self.m = schedule.num_stages, schedule.num_microbatches
        # what crosses each stage edge s → s+1: activations forward, the gradients of those with ``grad`` backward
        self.act_meta = [
            provider.activations(stage_idx=s, num_stages=self.num_stages, mb_size=mb_size)
            for s in range(self.num_stages - 1)
        ]
        self.store = WeightGradStore()
        for module in stages.values():
            set_grad_store(module, self.store)
        place = schedule.placement
        self._plan = [self._plan_of(a, place, pipeline_ranks) for a in self.actions]
        self._postings = self._posting_order()
        self.hooks: StepHooks = NoHooks()
        self.waiting_on: int | None = None  # global rank this rank waits for right now (for failure messages)
        self.waiting_what: str | None = None
        self.timing: StepTiming | None = None

    def _plan_of(self, a: Action, place: Sequence[int], ranks: Sequence[int]) -> _Plan:
        me, s = self.pp_rank, a.stage_idx
        recv = send = None
        if a.kind == Kind.F:
            recv = (s - 1, s) if s > 0 else None
            send = (s, s + 1) if s < self.num_stages - 1 else None
        elif a.kind in (Kind.B, Kind.I):
            recv = (s + 1, s) if s < self.num_stages - 1 else None
            send = (s, s - 1) if s > 0 else None
        if recv is not None and place[recv[0]] == me:
            recv = None  # same-rank hand-off
        if send is not None and place[send[1]] == me:
            send = None
        return _Plan(recv, None if recv is None else ranks[place[recv[0]]], send)

    def _posting_order(self) -> list[tuple[int, int]]:
        """(post_by, action_idx) of every receive, in the order they are posted.

        Per stream the receives follow the sender's order; each is posted no later than ``post_by``: the first action
        that needs it or any receive sent after it (so a stream's ``post_by`` never decreases along its order).
        """
        consumer = {
            (p.recv_stream, a.mb_idx): idx
            for idx, (a, p) in enumerate(zip(self.actions, self._plan, strict=True))
            if p.recv_stream is not None
        }
        out: list[tuple[int, int, int]] = []
        for st in p2p_streams(self.schedule):
            if st.dst_rank != self.pp_rank:
                continue
            idxs = [consumer[((st.src_stage, st.dst_stage), mb)] for mb in st.send_order]
            post_by = len(self.actions)
            for pos in range(len(idxs) - 1, -1, -1):
                post_by = min(post_by, idxs[pos])
                out.append((post_by, pos, idxs[pos]))
        out.sort()
        return [(post_by, idx) for post_by, _, idx in out]

    def p2p_bytes_per_mb(self) -> int:
        """One microbatch's activations across the widest stage edge (0 with one stage)."""
        return max((sum(meta.nbytes for meta in metas) for metas in self.act_meta), default=0)

    def recv_source(self, action_idx: int) -> int | None:
        """Global rank the action waits for, if any (for error messages)."""
        return self._plan[action_idx].recv_src

    def run_step(
        self,
        tokens: Sequence[torch.Tensor] | None,
        targets: Sequence[torch.Tensor] | None,
        *,
        exact_spans: bool = False,
    ) -> float:
        """One step's actions. ``tokens``/``targets``: per-microbatch (B, T) on the ranks holding the first/last stage.

        Gradients accumulate into the stages' ``.grad`` (the caller zeroes them); returns the summed loss
        (mean over the step's tokens) on the rank holding the last stage, else 0. Returns once the device has run
        the step's actions (on CUDA the end-of-step bubble begins then, not when the CPU has queued them).
        ``exact_spans``: drain the device at the step start and after each action, so every span ends when the device
        finished it (the profiling steps ask for it: it costs CUDA its run-ahead; on CPU there is nothing to drain).
        """
        n = len(self.actions)
        timing = StepTiming(0, [0] * n, [0] * n, [0] * n)
        if exact_spans:
            self.sync.drain()  # the previous step's optimizer may still run on the GPU
        timing.step_start_ns = time.monotonic_ns()
        self.transport.step_begin(timing.step_start_ns)
        st = _StepState(loss_sum=torch.zeros((), device=self.device))
        for idx, a in enumerate(self.actions):
            self._post_receives(st, upto=idx + 2 * self.prefetch)
            received = self._await_input(st, idx, timing)
            timing.start_ns[idx] = time.monotonic_ns()
            if a.kind == Kind.F:
                self._forward(st, a, self._plan[idx], received, tokens, targets)
            elif a.kind in (Kind.B, Kind.I):
                self._backward(st, a, self._plan[idx], received)
            else:  # W
                self.store.apply((a.stage_idx, a.mb_idx))
            if exact_spans:
                self.sync.drain()
            timing.end_ns[idx] = time.monotonic_ns()
        self.timing = timing
        if st.saved or st.local_act or st.local_grad or len(self.store):
            raise RuntimeError(
                f"schedule {self.schedule.name!r} left work undone on rank {self.pp_rank}: "
                f"forwards without backward {sorted(st.saved)}, deferred weight grads {len(self.store)}"
            )
        self.sync.drain()
        return float(st.loss_sum)

    # -- receive bookkeeping and the wait point ------------------------------------------------------------------
    def _post_receives(self, st: _StepState, *, upto: int) -> None:
        """Post every receive due by action ``upto`` (in each stream's send order, see :meth:`_posting_order`)."""
        postings = self._postings
        while st.next_post < len(postings) and postings[st.next_post][0] <= upto:
            ridx = postings[st.next_post][1]
            stream = self._plan[ridx].recv_stream
            assert stream is not None
            st.handles[ridx] = _Received(
                [
                    self.transport.recv(action_idx=ridx, shape=meta.shape, dtype=meta.dtype, stream=stream)
                    for meta in self._stream_meta(stream)
                ]
            )
            st.next_post += 1

    def _stream_meta(self, stream: Stream) -> tuple[TensorMeta, ...]:
        """The tensors one message set of ``stream`` carries: the edge's activations, or the gradients of them."""
        src, dst = stream
        if src < dst:
            return self.act_meta[src]
        return tuple(meta for meta in self.act_meta[dst] if meta.grad)

    def _await_input(self, st: _StepState, idx: int, timing: StepTiming) -> Tensors | None:
        """The peer's tensor action ``idx`` needs (None: it needs none). If the device would idle for it, this is a
        wait point: the hooks are told right before the rank blocks and right after it resumes."""
        plan = self._plan[idx]
        if plan.recv_stream is None:
            return None
        handle = st.handles.pop(idx)
        self.waiting_on, self.waiting_what = plan.recv_src, f"waiting for the input of action {self.actions[idx]}"
        if not handle.done() and self.sync.idle_before(handle):
            t0 = time.monotonic_ns()
            self.hooks.wait_begin(idx)
            self.hooks.while_waiting(idx, handle.done)
            received = self.sync.wait(handle)
            self.hooks.wait_end(idx)
            timing.wait_ns[idx] = time.monotonic_ns() - t0
        else:
            received = handle.wait()  # arrived: on CUDA this only orders the compute stream after it
        self.waiting_on = self.waiting_what = None
        return received

    # -- the actions -----------------------------------------------------------------------------------------------
    def _forward(
        self,
        st: _StepState,
        a: Action,
        plan: _Plan,
        received: Tensors | None,
        tokens: Sequence[torch.Tensor] | None,
        targets: Sequence[torch.Tensor] | None,
    ) -> None:
        """``F``: stage inputs (tokens on stage 0, else the received or hand-off activations) → outputs, sent on; on
        the last stage the provider's loss (÷ m, so the step's gradients are the mean's)."""
        s, mb, last = a.stage_idx, a.mb_idx, self.num_stages - 1
        if s == 0:
            inp = tokens[mb] if tokens is not None else None
            assert inp is not None, "the rank holding stage 0 needs tokens"
            xs: Tensors = ()
            inputs: Tensors = (inp,)
        else:
            got = received if received is not None else st.local_act.pop((s, mb))
            inputs = tuple(
                t.detach().requires_grad_(meta.grad) if meta.grad else t
                for t, meta in zip(got, self.act_meta[s - 1], strict=True)
            )
            xs = tuple(t for t, meta in zip(inputs, self.act_meta[s - 1], strict=True) if meta.grad)
        with self._autocast():
            out = self.stages[s](*inputs)
            if s == last:
                assert targets is not None, "the rank holding the last stage needs targets"
                loss = self.provider.loss(out, targets[mb]) / self.m
                st.loss_sum += loss.detach()
                outs: Tensors = (loss,)
            else:
                outs = out if isinstance(out, tuple) else (out,)
                self._check_outputs(s, outs)
        st.saved[(s, mb)] = (xs, outs)
        if s < last:
            if plan.send_stream is not None:
                for t in outs:
                    self.transport.send(t.detach(), stream=plan.send_stream)
            else:
                st.local_act[(s + 1, mb)] = tuple(t.detach() for t in outs)

    def _check_outputs(self, stage_idx: int, outs: Tensors) -> None:
        """The stage's outputs are what the provider declared (the receiver posted buffers of those shapes)."""
        check_outputs(self.provider.name, stage_idx, self.act_meta[stage_idx], outs)

    def _backward(self, st: _StepState, a: Action, plan: _Plan, received: Tensors | None) -> None:
        """``B`` (or ``I``: the input gradient only, weight gradients deferred to ``W``): the outputs' gradients (the
        loss on the last stage) → the inputs', sent on (zeros for an input the stage did not use)."""
        s, mb = a.stage_idx, a.mb_idx
        xs, outs = st.saved.pop((s, mb))
        if s == self.num_stages - 1:
            grads: Tensors | None = None
        else:
            got = received if received is not None else st.local_grad.pop((s, mb))
            metas = self.act_meta[s]
            outs = tuple(t for t, meta in zip(outs, metas, strict=True) if meta.grad)
            grads = got
        self.store.key = (s, mb) if a.kind == Kind.I else None
        try:
            torch.autograd.backward(outs, grad_tensors=grads)
        finally:
            self.store.key = None
        if s > 0:
            in_grads = tuple(x.grad if x.grad is not None else torch.zeros_like(x) for x in xs)
            if plan.send_stream is not None:
                for g in in_grads:
                    self.transport.send(g, stream=plan.send_stream)
            else:
                st.local_grad[(s - 1, mb)] = in_grads

    def flush_sends(self) -> None:
        self.transport.flush()

    def _autocast(self) -> torch.autocast:
        if self.autocast_dtype is None:
            return torch.autocast(device_type=self.device.type, enabled=False)
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
