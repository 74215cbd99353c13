"""The step clock of ``pipefill bench hook``: copied as ``sitecustomize.py`` into a directory on the ``PYTHONPATH`` of
every rank of both modes (with the hook and without), so the two are timed by the same means.

When the process imports ``torch.optim.optimizer`` it registers a global optimizer step post-hook (public torch API)
that notes the monotonic time after each ``step`` of the first optimizer that steps (torchtitan's interleaved
schedule has one optimizer per model chunk: one time per training step); at exit the times go to the file named by
``PIPEFILL_BENCH_CLOCK`` as JSON. It changes nothing the training computes, wraps nothing of the pipelining and runs
the same in both modes. It imports nothing of torch itself: :mod:`pipefill.importwatch` hands it the module it waits
for (the bench puts the core on the ``PYTHONPATH`` of both modes). Under the hook, the hook's own ``sitecustomize`` runs first and chains to this one.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from types import ModuleType
from typing import Any

from pipefill.importwatch import when_imported

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


def _install() -> None:
    path = os.environ.get(ENV_FILE)
    if not path:
        return
    atexit.register(_write, path)
    when_imported(TARGET, _on_import)


_install()
