"""The step clock of ``pipefill bench hook``: copied as ``sitecustomize.py`` into a directory on the ``PYTHONPATH`` of
every rank of both modes (with the hook and without), so the two are timed by the same means.

When the process imports ``torch.optim.optimizer`` it registers a global optimizer step post-hook (public torch API)
that notes the monotonic time after each ``step`` of the first optimizer that steps (torchtitan's interleaved
schedule has one optimizer per model chunk: one time per training step); at exit the times go to the file named by
``PIPEFILL_BENCH_CLOCK`` as JSON. It changes nothing the training computes, wraps nothing of the pipelining and runs
the same in both modes. Standard library only, and it imports nothing of torch itself: it gets the module it waits
for from the import system. Under the hook, the hook's own ``sitecustomize`` runs first and chains to this one.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ENV_FILE = "PIPEFILL_BENCH_CLOCK"
"""where the times go (unset: the clock does nothing)"""
TARGET = "torch.optim.optimizer"

_times: list[int] = []
_first: list[int] = []  # id() of the optimizer whose steps are counted


def _noted(optimizer: Any, args: Any, kwargs: Any) -> None:
    if not _first:
        _first.append(id(optimizer))
    if id(optimizer) == _first[0]:
        _times.append(time.monotonic_ns())


def _write(path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"optimizer_step_end_ns": _times}, f)


def _on_import(module: ModuleType) -> None:
    module.register_optimizer_step_post_hook(_noted)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _on_import(module)

        loader.exec_module = exec_module
        return spec


def _install() -> None:
    path = os.environ.get(ENV_FILE)
    if not path:
        return
    atexit.register(_write, path)
    if TARGET in sys.modules:
        _on_import(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _Finder())


_install()
