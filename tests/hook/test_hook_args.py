"""The hook reads a compute call's microbatch and ``full_backward`` as binding the call would, without binding it
(inspect's bind cost up to a millisecond of every step)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from torch.distributed.pipelining.stage import _PipelineStageBase

from pipefill_hook.patch import _Args

CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("forward_one_chunk", (3, ("x",)), {}),
    ("forward_one_chunk", (3,), {"args": ("x",), "save_forward_output": False}),
    ("forward_one_chunk", (), {"fwd_chunk_id": 5, "args": ("x",)}),
    ("backward_one_chunk", (2,), {}),
    ("backward_one_chunk", (2, None, False), {}),
    ("backward_one_chunk", (2,), {"full_backward": False, "last_backward": True}),
    ("backward_one_chunk", (), {"bwd_chunk_id": 7, "loss": None}),
    ("backward_weight_one_chunk", (4,), {"last_backward": True}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS)
def test_each_argument_reads_as_the_bound_call_has_it(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    fn = getattr(_PipelineStageBase, name)
    bound = inspect.signature(fn).bind(object(), *args, **kwargs)
    bound.apply_defaults()
    reader = _Args(fn)
    first = [*bound.arguments.values()][1]
    assert reader.get(args, kwargs, reader.first) == first
    for param in bound.arguments:
        if param != "self":
            assert reader.get(args, kwargs, param) == bound.arguments[param], param
    assert reader.get(args, kwargs, "not_a_parameter", "missing") == "missing"
