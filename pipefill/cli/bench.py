"""Run one benchmark; it prints one JSON object on stdout.

Benchmarks measure speed on purpose and are never part of the tests. Each compares against a baseline taken in
the same run (interleaved repetitions, medians). They live in :mod:`pipefill.bench`; the parts that need torch run
as worker processes of the images, so the core never imports them; a benchmark of another package (the operator's,
``pipefill_operator.bench``) runs as a process of its own for the same reason.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

from pipefill.bench import BENCHMARKS

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="options of that benchmark (see NAME --help)")


def run(args: argparse.Namespace) -> int:
    target = BENCHMARKS[args.name]
    if not target.startswith("pipefill."):  # the core may not import it (pyproject.toml's layers): a child process
        main = f"import sys; from {target} import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", main, *args.bench_args], check=False).returncode
    module = importlib.import_module(target)
    code: int = module.main(list(args.bench_args))
    return code
