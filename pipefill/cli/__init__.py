"""The ``pipefill`` command line.

Each subcommand lives in its own module with two functions, ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are named by string and imported only when their command runs, so ``pipefill --help`` stays fast and a
command whose image code (torch) is not installed fails with a clear message instead of breaking the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, one-line help). Keep sorted by name.
_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("pipefill.cli.bench", "run a benchmark and print JSON"),
    "cluster": ("pipefill.cli.cluster", "build, start or stop the local control plane with simulated GPU nodes"),
    "crds": ("pipefill.cli.crds", "write or check the CRDs and docs/api.md generated from the spec models"),
    "gpu-check": ("pipefill.cli.gpucheck", "run the GPU checks and benchmarks on a machine with one NVIDIA GPU"),
    "local": ("pipefill.cli.local", "run a PipelineTrainingJob and its FillJobs on this machine, no cluster needed"),
    "plan": ("pipefill.cli.plan", "show the execution plan of a fill workload for given bubbles"),
    "simulate": ("pipefill.cli.simulate", "predict a training job's bubbles and the fill capacity they offer"),
    "validate": ("pipefill.cli.validate", "validate manifests exactly as admission would"),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipefill", description="PipeFill: fill pipeline bubbles with useful work.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in sorted(_COMMANDS.items()):
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run one subcommand; returns the process exit code."""
    program, argv = argv is None, list(sys.argv[1:] if argv is None else argv)  # program: not a caller's (a test's)
    forks = argv[:1] == ["local"] or argv[:2] in (["bench", "colocation"], ["bench", "fill"])  # children: launcher's
    if program and forks and not {"-h", "--help"} & set(argv):
        from pipefill.local import early

        # its preload goes on beside this command's own imports; nothing above this call catches a child's exit
        early.start(fork=True)  # (pipefill/local/early.py)
    args = _build_parser().parse_args(argv)
    try:
        code: int = args._run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code
