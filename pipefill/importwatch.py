"""Run a function the moment a module is imported, without importing it first: how the bubble hook gets into a
user's process (:mod:`pipefill_hook.activate`, the pipelining schedules) and how ``pipefill bench hook`` times its
steps (:mod:`pipefill.bench.hook_clock`, the optimizer). Standard library only: a ``sitecustomize`` imports it in
every Python process it runs in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``target`` as the path finder would and runs ``callback`` after its module's code."""

    def __init__(self, target: str, callback: Callable[[ModuleType], None]) -> None:
        self.target, self.callback = target, callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.callback(module)

        loader.exec_module = exec_module
        return spec


def when_imported(target: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` right after ``target`` is first imported, or now when it already is; once per
    ``target`` and ``callback`` however often this is called before the import."""
    if target in sys.modules:
        callback(sys.modules[target])
    elif not any(isinstance(f, _Finder) and (f.target, f.callback) == (target, callback) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, callback))
