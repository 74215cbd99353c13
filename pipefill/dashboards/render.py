"""Render the dashboards to JSON files, and tell which files on disk are stale."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from pipefill.dashboards import fill_jobs, fleet, training_job

__all__ = ["DASHBOARDS", "render", "stale", "write"]

DASHBOARDS: dict[str, Callable[[], Any]] = {
    "fleet": fleet.build,
    "training-job": training_job.build,
    "fill-jobs": fill_jobs.build,
}
"""File stem → builder; the stems are the keys of ``queries.UIDS``."""


def render(stem: str) -> str:
    """One dashboard as the JSON Grafana imports: sorted keys and a final newline, so re-rendering is byte-stable."""
    return json.dumps(DASHBOARDS[stem](), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path) -> list[Path]:
    """Write ``<stem>.json`` for every dashboard into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem in DASHBOARDS:
        path = directory / f"{stem}.json"
        path.write_text(render(stem), encoding="utf-8")
        paths.append(path)
    return paths


def stale(directory: Path) -> list[str]:
    """What differs between ``directory`` and a fresh render: missing, changed and unexpected ``*.json`` files."""
    problems = []
    for stem in DASHBOARDS:
        path = directory / f"{stem}.json"
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != render(stem):
            problems.append(f"{path}: differs from what pipefill/dashboards renders")
    problems += [f"{p}: no dashboard renders it" for p in sorted(directory.glob("*.json")) if p.stem not in DASHBOARDS]
    return problems
