"""The FillJobs ``pipefill bench fill`` runs: one per workload it measures — each builtin and the user code of
``examples/user-code`` — written as manifests for the executor's ``files:`` work source."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from pipefill.bench.runs import log_tail
from pipefill.events import FILL_EVENTS, CommitEvent, FillEvent, JobEvent, read_events

__all__ = ["OUTPUT", "REPO", "WORKLOADS", "life_total", "stall_report", "write_jobs"]

OUTPUT = "output.log"
"""the fill executor's output, in its output directory (its LocalProcess's log)"""

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


def stall_report(work: Path, *, last: int = 200) -> str:
    """What the fill executor of a run that timed out did, from its event log and output: the bubbles it took and
    the steps it ran in them (over all, and over the ``last`` ones), why it stopped in the others, each job's last
    phase and committed units, and its output's last lines."""
    events = read_events(work / "fill" / FILL_EVENTS) if (work / "fill" / FILL_EVENTS).exists() else []
    bubbles = [e for e in events if isinstance(e, FillEvent)]
    recent = bubbles[-last:]
    stops = Counter(e.stop or "-" for e in recent if not e.steps)
    phases = {e.job: e for e in events if isinstance(e, JobEvent) and e.job}
    committed = {e.job: e.end for e in events if isinstance(e, CommitEvent)}
    jobs = "; ".join(
        f"{name} {e.phase}, {committed.get(name, 0)} of {e.total if e.total is not None else '?'} units committed"
        for name, e in phases.items()
    )
    margins = sorted({round(e.margin_s * 1e3, 2) for e in recent if e.margin_s})
    return (
        f"the fill executor took {len(bubbles)} bubbles and ran steps in {sum(1 for e in bubbles if e.steps)}; "
        f"of its last {len(recent)}, {sum(1 for e in recent if e.steps)} with steps, the others stopped by "
        f"{dict(stops.most_common()) or 'none'}"
        + (f", planned with learnt margins of {margins} ms" if margins else "")
        + f". Jobs: {jobs or 'none started'}. Its output's end:\n{log_tail(work / 'fill' / OUTPUT, chars=2000)}"
    )
