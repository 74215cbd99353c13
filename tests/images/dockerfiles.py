"""Read the three Dockerfiles and .dockerignore the way the builder does, enough for the tests to check them."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pipefill.devcluster.images import context_files as _context_files

__all__ = ["IMAGES", "ROOT", "Dockerfile", "context_files", "parse"]

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"operator": "operator/Dockerfile", "trainer": "trainer-image/Dockerfile", "fill": "fill-image/Dockerfile"}
"""Image name (the extra it installs, the last part of its reference) → Dockerfile."""


@dataclass
class Dockerfile:
    """The instructions that matter to the tests, in order; ``stages`` counts ``FROM``."""

    args: dict[str, str] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)
    runs: list[list[str]] = field(default_factory=list)
    """RUN commands per stage."""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""
    cmd: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def parse(path: Path) -> Dockerfile:
    """Instructions of the final stage (ENV, WORKDIR, USER, CMD) and of all stages (ARG before FROM, FROM, RUN)."""
    out = Dockerfile()
    for op, rest in _instructions(path.read_text()):
        if op == "ARG" and "=" in rest and not out.stages:
            name, value = rest.split("=", 1)
            out.args[name] = value
        elif op == "FROM":
            out.stages.append(rest)
            out.runs.append([])
            out.env, out.workdir, out.user, out.cmd = {}, "", "", []
        elif op == "RUN":
            out.runs[-1].append(rest)
        elif op == "ENV":
            for item in shlex.split(rest):
                name, value = item.split("=", 1)
                out.env[name] = value
        elif op == "WORKDIR":
            out.workdir = rest
        elif op == "USER":
            out.user = rest
        elif op == "CMD":
            out.cmd = json.loads(rest)
    return out


def context_files(root: Path = ROOT) -> list[Path]:
    """The files ``docker build`` sends for ``root`` under its .dockerignore (the core's reading, which the image
    cache of ``make images ENGINE=buildah`` hashes)."""
    return _context_files(root)
