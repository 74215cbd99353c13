"""``python -m pipefill.dashboards --write DIR`` (``make dashboards``) or ``--check DIR`` (``make lint``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipefill.dashboards.render import stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipefill.dashboards", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="DIR", help="render every dashboard into DIR/<name>.json")
    mode.add_argument("--check", type=Path, metavar="DIR", help="exit 1 if DIR differs from a fresh render")
    args = parser.parse_args(argv)
    if args.write is not None:
        for path in write(args.write):
            print(f"wrote {path}")
        return 0
    problems = stale(args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("the dashboards are stale: run `make dashboards`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
