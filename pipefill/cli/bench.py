"""Run one benchmark; it prints one JSON object on stdout.

Benchmarks measure speed on purpose and are never part of the tests. Each compares against a baseline taken in
the same run (interleaved repetitions, medians). Benchmarks that need torch live in the image packages and are
found by module name, so the core never imports them.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_arguments", "run"]

# benchmark name -> module with ``main(argv: list[str]) -> int``
_BENCHMARKS: dict[str, str] = {
    "channel": "pipefill.channel.bench",
    "colocation": "pipefill.local.colocation",
    "fill": "pipefill_fill.bench",
    "operator": "pipefill_operator.bench",
    "scheduler": "pipefill.queue.bench",
    "trainer": "pipefill_trainer.bench",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(_BENCHMARKS), help="which benchmark")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="options of that benchmark (see NAME --help)")


def run(args: argparse.Namespace) -> int:
    module_name = _BENCHMARKS[args.name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(f"benchmark {args.name!r} needs {exc.name!r}, which is not installed; install with `make venv`")
        return 2
    code: int = module.main(list(args.bench_args))
    return code
