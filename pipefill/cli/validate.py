"""Validate manifests with the CRD schema and CEL rules, as admission would; prints one line per manifest."""

from __future__ import annotations

import argparse
import sys

from pipefill.spec import SpecError, load_file

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", action="append", required=True, metavar="FILE", help="manifest file (repeatable)"
    )


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.filename:
        try:
            for manifest in load_file(path):
                print(f"{path}: {manifest.kind} {manifest.name!r} is valid")
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed = True
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
    return 1 if failed else 0
