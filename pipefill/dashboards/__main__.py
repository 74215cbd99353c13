"""``python -m pipefill.dashboards --write DIR [--rules FILE]`` (``make dashboards``) or ``--check DIR [--rules FILE]``
(``make lint``): the dashboards' JSON into DIR, and the Prometheus rule file into FILE."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipefill.dashboards import rules
from pipefill.dashboards.render import stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipefill.dashboards", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="DIR", help="render every dashboard into DIR/<name>.json")
    mode.add_argument("--check", type=Path, metavar="DIR", help="exit 1 if DIR differs from a fresh render")
    parser.add_argument("--rules", type=Path, metavar="FILE", help="the recording and alerting rules' file too")
    args = parser.parse_args(argv)
    if args.write is not None:
        for path in write(args.write):
            print(f"wrote {path}")
        if args.rules is not None:
            args.rules.parent.mkdir(parents=True, exist_ok=True)
            args.rules.write_text(rules.render(), encoding="utf-8")
            print(f"wrote {args.rules}")
        return 0
    problems = stale(args.check)
    if args.rules is not None and (not args.rules.exists() or args.rules.read_text(encoding="utf-8") != rules.render()):
        problems.append(f"{args.rules}: differs from what pipefill/dashboards/rules.py renders")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("the dashboards are stale: run `make dashboards`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
