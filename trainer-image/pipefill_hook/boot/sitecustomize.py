"""Put this directory (and the one holding ``pipefill_hook``) on ``PYTHONPATH``: every Python process started then
runs this at start-up. With ``PIPEFILL_HOOK=1`` it installs the hook (:mod:`pipefill_hook.activate`: nothing is
imported until the user's code imports the pipelining schedules); then it runs the ``sitecustomize`` this one
shadows, if the image has one further down ``sys.path``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    if os.environ.get("PIPEFILL_HOOK") != "1":
        return
    try:
        from pipefill_hook.activate import install

        install()
    except Exception as exc:  # the user's program runs regardless
        print(f"pipefill hook: not installed ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin is None:
        return
    if os.path.dirname(os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
