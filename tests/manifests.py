"""Small manifests the tests build, written once: a FillJob of the encoder-inference builtin and a tiny
PipelineTrainingJob, as plain objects (a test parses, writes or creates them). A module of its own: tests in any
folder import it."""

from __future__ import annotations

from typing import Any

__all__ = ["fill_job", "training_job"]


def fill_job(name: str, *, output: str, parameters: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """FillJob ``name`` embedding samples with the encoder-inference builtin into ``output``; ``parameters``: the
    builtin's (its defaults without them); ``spec``: more fields (totalSamples, priority, maxParallelRanks...)."""
    workload: dict[str, Any] = {"kind": "inference", "builtin": "encoder-inference"}
    if parameters is not None:
        workload["parameters"] = parameters
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": name},
        "spec": {"workload": workload, "output": {"path": output}, **spec},
    }


def training_job(name: str = "j", **spec: Any) -> dict[str, Any]:
    """PipelineTrainingJob ``name``: the gpt-tiny preset in 2 stages of 4 microbatches; ``spec``: more fields."""
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "PipelineTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "gpt-tiny"},
            "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 16},
            **spec,
        },
    }
