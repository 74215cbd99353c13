"""Edits of a stored PipelineTrainingJob's spec: those the API server must refuse (update-only CEL rules, naming
the field) and those it must let through, judged by ``pipefill.spec.parse(new, old=...)`` in
tests/spec/test_spec_updates.py and by a real API server in tests/cluster/test_spec_update_admission.py. A module of its own:
tests in any folder import it."""

from __future__ import annotations

import copy
from typing import Any

from malformed_cases import PTJ

__all__ = ["UPDATES", "merged"]


def merged(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``obj`` after the JSON merge patch ``patch`` (RFC 7386: None removes a key), as the API server applies it."""
    out = copy.deepcopy(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_DCP = merged(PTJ, {"spec": {"checkpoint": {"format": "dcp"}}})
_CPU = merged(PTJ, {"spec": {"gpuSharing": {"mode": "none"}}})
_INTERLEAVED = {"pipeline": {"schedule": "interleaved-1f1b", "virtualStages": 2}}

# (id, stored job, merge patch of its spec, field paths the refusal names; empty: the edit is allowed)
UPDATES: list[tuple[str, dict[str, Any], dict[str, Any], set[str]]] = [
    ("stages", PTJ, {"pipeline": {"stages": 4}}, {"spec.pipeline.stages"}),
    ("data-parallel", PTJ, {"pipeline": {"dataParallel": 2}}, {"spec.pipeline.dataParallel"}),
    ("model-layers", PTJ, {"model": {"layers": 8}}, {"spec.model.layers"}),
    ("model-width", PTJ, {"model": {"hiddenSize": 128}}, {"spec.model.hiddenSize"}),
    ("gpt-seq-len", PTJ, {"model": {"seqLen": 256}}, {"spec.model.seqLen"}),
    (
        "gpt-to-hugging-face",
        PTJ,
        {"model": {"layers": None, "hiddenSize": None, "heads": None, "huggingFace": {"path": "/m"}}},
        {"spec.model.huggingFace"},
    ),
    (
        "our-trainer-to-a-command",
        PTJ,
        {"model": None, "pipeline": None, "trainer": {"command": ["torchrun"], "stages": 2}},
        {"spec.trainer"},
    ),
    ("checkpoint-path", PTJ, {"checkpoint": {"path": "/elsewhere"}}, {"spec.checkpoint.path"}),
    ("checkpoint-claim", PTJ, {"checkpoint": {"claimName": "ckpt"}}, {"spec.checkpoint.claimName"}),
    ("checkpoint-format", PTJ, {"checkpoint": {"format": "dcp"}}, {"spec.checkpoint.format"}),
    ("gang", PTJ, {"scheduling": {"gang": "volcano"}}, {"spec.scheduling.gang"}),
    ("disruption-budget", PTJ, {"scheduling": {"podDisruptionBudget": True}}, {"spec.scheduling.podDisruptionBudget"}),
    ("dra-gpus", PTJ, {"resources": {"gpus": 2}}, {"spec.resources.gpus"}),
    ("sharing-mode", PTJ, {"gpuSharing": {"mode": "none"}}, {"spec.gpuSharing.mode"}),
    ("torch-cut", PTJ, _INTERLEAVED, {"spec.pipeline.virtualStages"}),
    # allowed: taken by the next gang (SpecChangePending says so) or at once
    ("steps", PTJ, {"steps": 500}, set()),
    ("schedule-and-microbatches", PTJ, {"pipeline": {"schedule": "gpipe", "microbatches": 8}}, set()),
    ("learning-rate", PTJ, {"optimizer": {"learningRate": 0.001}}, set()),
    ("fill-off", PTJ, {"fill": {"enabled": False}}, set()),
    ("suspend", PTJ, {"runPolicy": {"suspend": True, "backoffLimit": 5}}, set()),
    ("images", PTJ, {"trainerImage": "example.com/trainer:2", "fillImage": "example.com/fill:2"}, set()),
    ("checkpoint-interval", PTJ, {"checkpoint": {"intervalSteps": 10}}, set()),
    ("dcp-cut", _DCP, _INTERLEAVED, set()),
    ("gpus-without-dra", _CPU, {"resources": {"gpus": 2}}, set()),
]
