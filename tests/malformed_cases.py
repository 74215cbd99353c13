"""The malformed manifests every runner must refuse with the API server's message (field, value, rule, fix): judged
by the CRD's schema and CEL rules and by ``pipefill.spec.parse`` in tests/spec/test_malformed.py, and through
``pipefill local`` in tests/local/test_local_bad_input.py. A module of its own: tests in any folder import it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from manifests import fill_job

__all__ = ["CASES", "DELETE", "FJ", "PTJ", "ROOT", "changed", "crd_schema"]

ROOT = Path(__file__).resolve().parents[1]
DELETE = object()


def crd_schema(kind: str) -> dict[str, Any]:
    plural = {"PipelineTrainingJob": "pipelinetrainingjobs", "FillJob": "filljobs"}[kind]
    crd = yaml.safe_load((ROOT / "crds" / f"pipefill.io_{plural}.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


PTJ: dict[str, Any] = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "PipelineTrainingJob",
    "metadata": {"name": "job"},
    "spec": {
        "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 8},
        "model": {"layers": 4, "hiddenSize": 64, "heads": 4},
    },
}
FJ: dict[str, Any] = fill_job("fill", output="/out", totalSamples=100)


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``base`` with dotted paths (``spec__pipeline__stages``) set or deleted."""
    obj = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return obj


# (id, manifest, field the message must name, words of the rule the message must contain)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("zero-stages", changed(PTJ, spec__pipeline__stages=0), "spec.pipeline.stages", "greater than or equal to 1"),
    ("string-stages", changed(PTJ, spec__pipeline__stages="two"), "spec.pipeline.stages", "must be of type integer"),
    (
        "negative-microbatches",
        changed(PTJ, spec__pipeline__microbatches=-1),
        "spec.pipeline.microbatches",
        "greater than or equal to 1",
    ),
    (
        "batch-not-divisible",
        changed(PTJ, spec__pipeline__globalBatch=10),
        "spec.pipeline.globalBatch",
        "must be divisible by microbatches × dataParallel = 4",
    ),
    (
        "batch-not-divisible-dp",
        changed(PTJ, spec__pipeline__dataParallel=3),
        "spec.pipeline.globalBatch",
        "divisible by microbatches × dataParallel = 12",
    ),
    (
        "schedule-too-large",  # 4 × 32 768: validating a schedule of 2 M stage-microbatches took 98 s and 1.8 GB
        changed(PTJ, spec__pipeline__stages=4, spec__pipeline__microbatches=32768, spec__pipeline__globalBatch=32768),
        "spec.pipeline.microbatches",
        "stages × virtualStages × microbatches = 131072 exceeds 65536",
    ),
    (
        "too-many-rank-pods",
        changed(PTJ, spec__pipeline__dataParallel=65536, spec__pipeline__globalBatch=4 * 65536),
        "spec.pipeline.dataParallel",
        "stages × dataParallel = 131072 rank pods exceeds 65536",
    ),
    (
        "unknown-schedule",
        changed(PTJ, spec__pipeline__schedule="pipedream"),
        "spec.pipeline.schedule",
        'supported values: "gpipe"',
    ),
    (
        "virtual-with-1f1b",
        changed(PTJ, spec__pipeline__virtualStages=2),
        "spec.pipeline.virtualStages",
        "not allowed with schedule 1f1b",
    ),
    (
        "zbv-needs-two",
        changed(PTJ, spec__pipeline__schedule="zbv", spec__pipeline__virtualStages=1),
        "spec.pipeline.virtualStages",
        "must be 2 for schedule zbv",
    ),
    (
        "custom-without-csv",
        changed(PTJ, spec__pipeline__schedule="custom"),
        "spec.pipeline.customSchedule",
        "required with schedule custom",
    ),
    (
        "csv-without-custom",
        changed(PTJ, spec__pipeline__customSchedule={"name": "s"}),
        "spec.pipeline.customSchedule",
        "not allowed otherwise",
    ),
    (
        "more-stages-than-layers",
        changed(PTJ, spec__pipeline__stages=8),
        "spec.pipeline.stages",
        "exceeds the model's 4 layers",
    ),
    (
        "virtual-stages-exceed-layers",
        changed(PTJ, spec__pipeline__schedule="interleaved-1f1b", spec__pipeline__virtualStages=3),
        "spec.pipeline.stages",
        "stages × virtualStages = 6",
    ),
    (
        "preset-and-layers",
        changed(PTJ, spec__model__preset="gpt-tiny"),
        "spec.model",
        "either preset, or all of layers",
    ),
    ("missing-heads", changed(PTJ, spec__model__heads=DELETE), "spec.model", "either preset, or all of layers"),
    (
        "hidden-not-multiple",
        changed(PTJ, spec__model__hiddenSize=100, spec__model__heads=3),
        "spec.model.hiddenSize",
        "must be a multiple of heads (3)",
    ),
    ("unknown-preset", changed(PTJ, spec__model={"preset": "gpt-5"}), "spec.model.preset", "should match"),
    (
        "huggingface-and-layers",
        changed(PTJ, spec__model__huggingFace={"path": "/models/llama"}),
        "spec.model",
        "or huggingFace or python alone",
    ),
    (
        "huggingface-claim-and-configmap",
        changed(PTJ, spec__model={"huggingFace": {"path": "/m", "claimName": "models", "configMap": "llama"}}),
        "spec.model.huggingFace.configMap",
        "set claimName (a volume with the directory) or configMap (a config alone), not both",
    ),
    (
        "huggingface-pretrained-from-configmap",
        changed(PTJ, spec__model={"huggingFace": {"path": "/m", "configMap": "llama", "weights": "pretrained"}}),
        "spec.model.huggingFace.weights",
        "pretrained needs the weights' files",
    ),
    (
        "huggingface-export-without-dcp",
        changed(
            PTJ,
            spec__model={"huggingFace": {"path": "/m", "exportPath": "/checkpoints/export"}},
            spec__checkpoint__format="torch",
        ),
        "spec.checkpoint.format",
        "exportPath reads the final dcp checkpoint",
    ),
    (
        "python-and-huggingface",
        changed(PTJ, spec__model={"python": {"function": "m:build"}, "huggingFace": {"path": "/m"}}),
        "spec.model",
        "or huggingFace or python alone",
    ),
    (
        "python-code-path-without-storage",
        changed(PTJ, spec__model={"python": {"function": "m:build", "code": {"path": "models"}}}),
        "spec.model.python.code.path",
        "is a directory on the fill storage: set spec.fill.storage",
    ),
    (
        "python-code-both",
        changed(PTJ, spec__model={"python": {"function": "m:build", "code": {"path": "m", "configMap": "m"}}}),
        "spec.model.python.code",
        "set exactly one of path and configMap",
    ),
    (
        "python-function-without-colon",
        changed(PTJ, spec__model={"python": {"function": "mymodel.build"}}),
        "spec.model.python.function",
        "should match",
    ),
    (
        "huggingface-unknown-dtype",
        changed(PTJ, spec__model={"huggingFace": {"path": "/m", "dtype": "float16"}}),
        "spec.model.huggingFace.dtype",
        "Unsupported value",
    ),
    ("misspelled-field", changed(PTJ, spec__pipeline__stagez=2), "spec.pipeline.stagez", 'did you mean "stages"'),
    ("unknown-spec-field", changed(PTJ, spec__replicas=2), "spec.replicas", "Unknown field"),
    ("missing-pipeline", changed(PTJ, spec__pipeline=DELETE), "spec.pipeline", "Required value"),
    (
        "missing-microbatches",
        changed(PTJ, spec__pipeline__microbatches=DELETE),
        "spec.pipeline.microbatches",
        "Required value",
    ),
    (
        "absurd-stages",
        changed(PTJ, spec__pipeline__stages=100000),
        "spec.pipeline.stages",
        "less than or equal to 1024",
    ),
    (
        "absurd-batch",
        changed(PTJ, spec__pipeline__globalBatch=10**12),
        "spec.pipeline.globalBatch",
        "less than or equal to 16777216",
    ),
    (
        "text-without-path",
        changed(PTJ, spec__data={"source": "text"}),
        "spec.data.path",
        "required for source tokenFile and text",
    ),
    ("synthetic-with-path", changed(PTJ, spec__data={"path": "/x"}), "spec.data.path", "not allowed for synthetic"),
    ("bad-quantity", changed(PTJ, spec__resources={"memory": "lots"}), "spec.resources.memory", "Kubernetes quantity"),
    (
        "dra-without-gpu",
        changed(PTJ, spec__resources={"gpus": 0}),
        "spec.gpuSharing.mode",
        "needs spec.resources.gpus >= 1",
    ),
    (
        "mps-without-gpu",
        changed(PTJ, spec__resources={"gpus": 0}, spec__gpuSharing={"mode": "none", "mps": {"enabled": True}}),
        "spec.gpuSharing.mps.enabled",
        "needs a shared GPU",
    ),
    (
        "exit-code-zero",
        changed(PTJ, spec__runPolicy={"restartOnExitCodes": [0, 75]}),
        "spec.runPolicy.restartOnExitCodes",
        "exit codes 1–255",
    ),
    (
        "negative-min-bubble",
        changed(PTJ, spec__fill={"minBubbleMilliseconds": -5}),
        "spec.fill.minBubbleMilliseconds",
        "greater than or equal to 0",
    ),
    (
        "zero-learning-rate",
        changed(PTJ, spec__optimizer={"learningRate": 0}),
        "spec.optimizer.learningRate",
        "should be greater than 0",
    ),
    (
        "layers-per-stage-count",
        changed(PTJ, spec__pipeline__layersPerStage=[1, 1, 2]),
        "spec.pipeline.layersPerStage",
        "has 3 entries, needs stages × virtualStages = 2",
    ),
    (
        "gang-too-large",
        changed(PTJ, spec__scheduling={"gangMinMembers": 5}),
        "spec.scheduling.gangMinMembers",
        "cannot exceed",
    ),
    (
        "1f1b-fewer-microbatches-than-stages",
        changed(PTJ, spec__pipeline__stages=4, spec__pipeline__microbatches=2),
        "spec.pipeline.microbatches",
        "fewer than the 4 stages: schedule 1f1b needs microbatches >= stages",
    ),
    (
        "interleaved-microbatches-not-multiple",
        changed(
            PTJ,
            spec__pipeline__schedule="interleaved-1f1b",
            spec__pipeline__virtualStages=2,
            spec__pipeline__microbatches=5,
            spec__pipeline__globalBatch=10,
            spec__model__layers=8,
        ),
        "spec.pipeline.microbatches",
        "not a multiple of its rounds max(1, microbatches / stages) = 2",
    ),
    (
        "visible-devices-two-gpus",
        changed(PTJ, spec__resources={"gpus": 2}, spec__gpuSharing={"mode": "visibleDevices"}),
        "spec.resources.gpus",
        "supports exactly one GPU per rank",
    ),
    ("bad-name", changed(PTJ, metadata__name="Bad_Name"), "metadata.name", "lower-case letters"),
    ("long-name", changed(PTJ, metadata__name="a" * 49), "metadata.name", "at most 48 characters"),
    ("bool-steps", changed(PTJ, spec__steps=True), "spec.steps", "must be of type integer"),
    (
        "both-builtin-and-import",
        changed(FJ, spec__workload__importPath="my.mod:Work"),
        "spec.workload",
        "exactly one of builtin, entryPoint and importPath",
    ),
    (
        "neither-builtin-nor-import",
        changed(FJ, spec__workload__builtin=DELETE),
        "spec.workload",
        "exactly one of builtin, entryPoint and importPath",
    ),
    (
        "code-without-import-path",
        changed(FJ, spec__workload__code={"configMap": "my-code"}),
        "spec.workload.code",
        "set importPath (package.module:Class) or remove code",
    ),
    (
        "code-path-escapes-storage",
        changed(FJ, spec__workload={"kind": "inference", "importPath": "m:C", "code": {"path": "code/../../etc"}}),
        "spec.workload.code.path",
        "must be relative to the fill storage and must not contain '..'",
    ),
    (
        "code-path-and-config-map",
        changed(FJ, spec__workload={"kind": "inference", "importPath": "m:C", "code": {"path": "c", "configMap": "c"}}),
        "spec.workload.code",
        "set exactly one of path and configMap",
    ),
    (
        "bad-import-path",
        changed(FJ, spec__workload={"kind": "training", "importPath": "not a path"}),
        "spec.workload.importPath",
        "should match",
    ),
    (
        "builtin-kind-mismatch",
        changed(FJ, spec__workload__kind="training"),
        "spec.workload.kind",
        "set kind: inference",
    ),
    ("samples-and-steps", changed(FJ, spec__totalSteps=5), "spec", "exactly one of totalSamples and totalSteps"),
    (
        "inference-with-steps",
        changed(FJ, spec__totalSamples=DELETE, spec__totalSteps=5),
        "spec.totalSamples",
        "required for inference",
    ),
    ("missing-output", changed(FJ, spec__output=DELETE), "spec.output", "Required value"),
    ("too-many-ranks", changed(FJ, spec__maxParallelRanks=1025), "spec.maxParallelRanks", "less than or equal to 1024"),
    ("empty-slices", changed(FJ, spec__minSliceSamples=0), "spec.minSliceSamples", "greater than or equal to 1"),
    ("bad-deadline", changed(FJ, spec__deadline="tomorrow"), "spec.deadline", "RFC 3339"),
    (
        "selector-in-without-values",
        changed(FJ, spec__hostSelector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
        "spec.hostSelector.matchExpressions[0].values",
        "must be non-empty",
    ),
    ("absurd-priority", changed(FJ, spec__priority=5000), "spec.priority", "less than or equal to 1000"),
    (
        "input-on-another-claim",
        changed(
            FJ, spec__input={"path": "in.jsonl", "claimName": "other"}, spec__output={"path": "o", "claimName": "fs"}
        ),
        "spec.input.claimName",
        "must be spec.output.claimName",
    ),
    (
        "fill-storage-over-tmp",
        changed(PTJ, spec__fill={"storage": {"claimName": "fs", "mountPath": "/tmp"}}),
        "spec.fill.storage.mountPath",
        "must not be a path the fill sidecar mounts already",
    ),
    (
        "fill-storage-relative-mount",
        changed(PTJ, spec__fill={"storage": {"claimName": "fs", "mountPath": "fill"}}),
        "spec.fill.storage.mountPath",
        "should match",
    ),
    (
        "fill-job-selector-in-without-values",
        changed(PTJ, spec__fill={"jobSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
        "spec.fill.jobSelector.matchExpressions[0].values",
        "must be non-empty",
    ),
    (
        "unknown-work-kind",
        changed(FJ, spec__workload__kind="batch"),
        "spec.workload.kind",
        'supported values: "inference", "training"',
    ),
]
