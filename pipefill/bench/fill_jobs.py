"""The FillJobs ``pipefill bench fill`` runs: one per workload it measures — each builtin and the user code of
``examples/user-code`` — written as manifests for the executor's ``files:`` work source."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

__all__ = ["REPO", "WORKLOADS", "life_total", "write_jobs"]

REPO = Path(__file__).resolve().parents[2]
"""the checkout the benchmark runs from: the user code and the demo corpus are its ``examples/``"""

WORKLOADS = ("encoder-inference", "train-classifier", "sentence-embedding", "user-code")

_USER_CODE = "examples/user-code"  # relative to the fill storage (PIPEFILL_FILL_STORAGE_DIR = REPO)
_CORPUS = REPO / "examples" / "data" / "sentences.txt"
_STEADY_TOTAL = {"encoder-inference": 500_000, "train-classifier": 10**7, "sentence-embedding": 100_000}
_LIFE_TOTAL = {"encoder-inference": 4096, "train-classifier": 600, "sentence-embedding": 64, "user-code": 20_000}
"""units of one job in whole-life mode: a few seconds of fill work each on one core of the development VM"""


def life_total(workload: str) -> int:
    return _LIFE_TOTAL[workload]


def write_jobs(
    work: Path, workload: str, *, names: list[str], total: int | None, encoder: dict[str, Any], split: int
) -> Path:
    """Manifests of FillJobs ``names`` of ``workload`` in ``work/jobs`` (returned), each ``total`` units (None: more
    than a run does), an inference job split for up to ``split`` ranks (slices: one executor runs them in turn)."""
    if workload not in WORKLOADS:
        raise ValueError(f"--workload {workload!r}: not one of {', '.join(WORKLOADS)}; pick one of them")
    jobs = work / "jobs"
    jobs.mkdir(parents=True)
    units = total or _STEADY_TOTAL.get(workload, 10**6)
    for name in names:
        spec = _spec(work, workload, units, encoder)
        spec["output"] = {"path": str(work / "out" / name)}
        if spec["workload"]["kind"] == "inference" and split > 1:
            spec["maxParallelRanks"] = split
        doc = {"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJob", "metadata": {"name": name}, "spec": spec}
        (jobs / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return jobs


def _spec(work: Path, workload: str, units: int, encoder: dict[str, Any]) -> dict[str, Any]:
    if workload == "encoder-inference":
        return {"workload": {"kind": "inference", "builtin": workload, "parameters": encoder}, "totalSamples": units}
    if workload == "train-classifier":
        return {"workload": {"kind": "training", "builtin": workload}, "totalSteps": units}
    if workload == "sentence-embedding":
        return {"workload": {"kind": "inference", "builtin": workload, "parameters": {"maxTokens": 24}}, "totalSamples": units}  # fmt: skip
    if not (REPO / _USER_CODE / "acme_fill" / "wordstats.py").is_file():
        raise ValueError(f"--workload user-code: {REPO / _USER_CODE} is missing; run the benchmark from a checkout")
    lines = work / "lines.txt"  # the demo corpus, repeated to ``units`` lines
    with _CORPUS.open(encoding="utf-8") as f:
        corpus = f.read().splitlines()
    lines.write_text("".join(f"{line}\n" for line in itertools.islice(itertools.cycle(corpus), units)))
    code = {"path": _USER_CODE}
    return {
        "workload": {"kind": "inference", "importPath": "acme_fill.wordstats:WordStats", "code": code},
        "input": {"path": str(lines)},
        "totalSamples": units,
    }
