"""Write the CRDs (crds/*.yaml) and the API reference (docs/api.md) from the spec models, or check they are current."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from pipefill.spec import KINDS, crd
from pipefill.spec.docs import api_reference

__all__ = ["add_arguments", "render", "run"]

_HEADER = "# Generated from pipefill/spec by `make crds`. Do not edit: change the models and regenerate.\n"


def render() -> dict[str, str]:
    """File name -> content of every generated CRD."""
    return {
        info.file_name: _HEADER + yaml.safe_dump(crd(kind), sort_keys=False, width=10_000, allow_unicode=True)
        for kind, info in KINDS.items()
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", type=Path, nargs="+", help="write the CRDs into each DIR")
    mode.add_argument(
        "--check", metavar="DIR", type=Path, nargs="+", help="fail if a DIR's CRDs differ from the models"
    )
    parser.add_argument(
        "--docs", metavar="FILE", type=Path, default=None, help="also write or check this API reference"
    )


def run(args: argparse.Namespace) -> int:
    wanted = {folder / name: text for folder in (args.write or args.check) for name, text in render().items()}
    if args.docs is not None:
        wanted[args.docs] = api_reference()
    if args.write:
        for path, text in wanted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    stale = [str(p) for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    for path in stale:
        print(f"{path} is out of date with pipefill/spec: run `make crds` and commit the result")
    return 1 if stale else 0
