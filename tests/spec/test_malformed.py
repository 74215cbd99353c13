"""Malformed manifests are rejected by the CRD's schema and CEL rules and by the Python loader, with one message.

Each case is checked twice: against the CRD YAML committed in crds/ (the schema the API server gets, CEL rules run
by a CEL library) and through ``pipefill.spec.parse`` (what ``pipefill local`` and the operator use).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipefill.spec import FillJobStatus, SpecError, parse, parse_yaml
from pipefill.spec._schema import from_obj
from pipefill.spec.validation import check_object

ROOT = Path(__file__).resolve().parents[2]
DELETE = object()


def _crd_schema(kind: str) -> dict[str, Any]:
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
FJ: dict[str, Any] = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "FillJob",
    "metadata": {"name": "fill"},
    "spec": {
        "workload": {"kind": "inference", "builtin": "encoder-inference"},
        "output": {"path": "/out"},
        "totalSamples": 100,
    },
}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
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
    ("zero-stages", _with(PTJ, spec__pipeline__stages=0), "spec.pipeline.stages", "greater than or equal to 1"),
    ("string-stages", _with(PTJ, spec__pipeline__stages="two"), "spec.pipeline.stages", "must be of type integer"),
    (
        "negative-microbatches",
        _with(PTJ, spec__pipeline__microbatches=-1),
        "spec.pipeline.microbatches",
        "greater than or equal to 1",
    ),
    (
        "batch-not-divisible",
        _with(PTJ, spec__pipeline__globalBatch=10),
        "spec.pipeline.globalBatch",
        "must be divisible by microbatches × dataParallel = 4",
    ),
    (
        "batch-not-divisible-dp",
        _with(PTJ, spec__pipeline__dataParallel=3),
        "spec.pipeline.globalBatch",
        "divisible by microbatches × dataParallel = 12",
    ),
    (
        "schedule-too-large",  # 4 × 32 768: validating a schedule of 2 M stage-microbatches took 98 s and 1.8 GB
        _with(PTJ, spec__pipeline__stages=4, spec__pipeline__microbatches=32768, spec__pipeline__globalBatch=32768),
        "spec.pipeline.microbatches",
        "stages × virtualStages × microbatches = 131072 exceeds 65536",
    ),
    (
        "too-many-rank-pods",
        _with(PTJ, spec__pipeline__dataParallel=65536, spec__pipeline__globalBatch=4 * 65536),
        "spec.pipeline.dataParallel",
        "stages × dataParallel = 131072 rank pods exceeds 65536",
    ),
    (
        "unknown-schedule",
        _with(PTJ, spec__pipeline__schedule="pipedream"),
        "spec.pipeline.schedule",
        'supported values: "gpipe"',
    ),
    (
        "virtual-with-1f1b",
        _with(PTJ, spec__pipeline__virtualStages=2),
        "spec.pipeline.virtualStages",
        "not allowed with schedule 1f1b",
    ),
    (
        "zbv-needs-two",
        _with(PTJ, spec__pipeline__schedule="zbv", spec__pipeline__virtualStages=1),
        "spec.pipeline.virtualStages",
        "must be 2 for schedule zbv",
    ),
    (
        "custom-without-csv",
        _with(PTJ, spec__pipeline__schedule="custom"),
        "spec.pipeline.customSchedule",
        "required with schedule custom",
    ),
    (
        "csv-without-custom",
        _with(PTJ, spec__pipeline__customSchedule={"name": "s"}),
        "spec.pipeline.customSchedule",
        "not allowed otherwise",
    ),
    (
        "more-stages-than-layers",
        _with(PTJ, spec__pipeline__stages=8),
        "spec.pipeline.stages",
        "exceeds the model's 4 layers",
    ),
    (
        "virtual-stages-exceed-layers",
        _with(PTJ, spec__pipeline__schedule="interleaved-1f1b", spec__pipeline__virtualStages=3),
        "spec.pipeline.stages",
        "stages × virtualStages = 6",
    ),
    ("preset-and-layers", _with(PTJ, spec__model__preset="gpt-tiny"), "spec.model", "either preset, or all of layers"),
    ("missing-heads", _with(PTJ, spec__model__heads=DELETE), "spec.model", "either preset, or all of layers"),
    (
        "hidden-not-multiple",
        _with(PTJ, spec__model__hiddenSize=100, spec__model__heads=3),
        "spec.model.hiddenSize",
        "must be a multiple of heads (3)",
    ),
    ("unknown-preset", _with(PTJ, spec__model={"preset": "gpt-5"}), "spec.model.preset", "should match"),
    (
        "huggingface-and-layers",
        _with(PTJ, spec__model__huggingFace={"path": "/models/llama"}),
        "spec.model",
        "or huggingFace or python alone",
    ),
    (
        "huggingface-claim-and-configmap",
        _with(PTJ, spec__model={"huggingFace": {"path": "/m", "claimName": "models", "configMap": "llama"}}),
        "spec.model.huggingFace.configMap",
        "set claimName (a volume with the directory) or configMap (a config alone), not both",
    ),
    (
        "huggingface-pretrained-from-configmap",
        _with(PTJ, spec__model={"huggingFace": {"path": "/m", "configMap": "llama", "weights": "pretrained"}}),
        "spec.model.huggingFace.weights",
        "pretrained needs the weights' files",
    ),
    (
        "huggingface-export-without-dcp",
        _with(
            PTJ,
            spec__model={"huggingFace": {"path": "/m", "exportPath": "/checkpoints/export"}},
            spec__checkpoint__format="torch",
        ),
        "spec.checkpoint.format",
        "exportPath reads the final dcp checkpoint",
    ),
    (
        "python-and-huggingface",
        _with(PTJ, spec__model={"python": {"function": "m:build"}, "huggingFace": {"path": "/m"}}),
        "spec.model",
        "or huggingFace or python alone",
    ),
    (
        "python-code-path-without-storage",
        _with(PTJ, spec__model={"python": {"function": "m:build", "code": {"path": "models"}}}),
        "spec.model.python.code.path",
        "is a directory on the fill storage: set spec.fill.storage",
    ),
    (
        "python-code-both",
        _with(PTJ, spec__model={"python": {"function": "m:build", "code": {"path": "m", "configMap": "m"}}}),
        "spec.model.python.code",
        "set exactly one of path and configMap",
    ),
    (
        "python-function-without-colon",
        _with(PTJ, spec__model={"python": {"function": "mymodel.build"}}),
        "spec.model.python.function",
        "should match",
    ),
    (
        "huggingface-unknown-dtype",
        _with(PTJ, spec__model={"huggingFace": {"path": "/m", "dtype": "float16"}}),
        "spec.model.huggingFace.dtype",
        "Unsupported value",
    ),
    ("misspelled-field", _with(PTJ, spec__pipeline__stagez=2), "spec.pipeline.stagez", 'did you mean "stages"'),
    ("unknown-spec-field", _with(PTJ, spec__replicas=2), "spec.replicas", "Unknown field"),
    ("missing-pipeline", _with(PTJ, spec__pipeline=DELETE), "spec.pipeline", "Required value"),
    (
        "missing-microbatches",
        _with(PTJ, spec__pipeline__microbatches=DELETE),
        "spec.pipeline.microbatches",
        "Required value",
    ),
    ("absurd-stages", _with(PTJ, spec__pipeline__stages=100000), "spec.pipeline.stages", "less than or equal to 1024"),
    (
        "absurd-batch",
        _with(PTJ, spec__pipeline__globalBatch=10**12),
        "spec.pipeline.globalBatch",
        "less than or equal to 16777216",
    ),
    (
        "text-without-path",
        _with(PTJ, spec__data={"source": "text"}),
        "spec.data.path",
        "required for source tokenFile and text",
    ),
    ("synthetic-with-path", _with(PTJ, spec__data={"path": "/x"}), "spec.data.path", "not allowed for synthetic"),
    ("bad-quantity", _with(PTJ, spec__resources={"memory": "lots"}), "spec.resources.memory", "Kubernetes quantity"),
    (
        "dra-without-gpu",
        _with(PTJ, spec__resources={"gpus": 0}),
        "spec.gpuSharing.mode",
        "needs spec.resources.gpus >= 1",
    ),
    (
        "mps-without-gpu",
        _with(PTJ, spec__resources={"gpus": 0}, spec__gpuSharing={"mode": "none", "mps": {"enabled": True}}),
        "spec.gpuSharing.mps.enabled",
        "needs a shared GPU",
    ),
    (
        "exit-code-zero",
        _with(PTJ, spec__runPolicy={"restartOnExitCodes": [0, 75]}),
        "spec.runPolicy.restartOnExitCodes",
        "exit codes 1–255",
    ),
    (
        "negative-min-bubble",
        _with(PTJ, spec__fill={"minBubbleMilliseconds": -5}),
        "spec.fill.minBubbleMilliseconds",
        "greater than or equal to 0",
    ),
    (
        "zero-learning-rate",
        _with(PTJ, spec__optimizer={"learningRate": 0}),
        "spec.optimizer.learningRate",
        "should be greater than 0",
    ),
    (
        "layers-per-stage-count",
        _with(PTJ, spec__pipeline__layersPerStage=[1, 1, 2]),
        "spec.pipeline.layersPerStage",
        "has 3 entries, needs stages × virtualStages = 2",
    ),
    (
        "gang-too-large",
        _with(PTJ, spec__scheduling={"gangMinMembers": 5}),
        "spec.scheduling.gangMinMembers",
        "cannot exceed",
    ),
    (
        "1f1b-fewer-microbatches-than-stages",
        _with(PTJ, spec__pipeline__stages=4, spec__pipeline__microbatches=2),
        "spec.pipeline.microbatches",
        "fewer than the 4 stages: schedule 1f1b needs microbatches >= stages",
    ),
    (
        "interleaved-microbatches-not-multiple",
        _with(
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
        _with(PTJ, spec__resources={"gpus": 2}, spec__gpuSharing={"mode": "visibleDevices"}),
        "spec.resources.gpus",
        "supports exactly one GPU per rank",
    ),
    ("bad-name", _with(PTJ, metadata__name="Bad_Name"), "metadata.name", "lower-case letters"),
    ("long-name", _with(PTJ, metadata__name="a" * 49), "metadata.name", "at most 48 characters"),
    ("bool-steps", _with(PTJ, spec__steps=True), "spec.steps", "must be of type integer"),
    (
        "both-builtin-and-import",
        _with(FJ, spec__workload__importPath="my.mod:Work"),
        "spec.workload",
        "exactly one of builtin, entryPoint and importPath",
    ),
    (
        "neither-builtin-nor-import",
        _with(FJ, spec__workload__builtin=DELETE),
        "spec.workload",
        "exactly one of builtin, entryPoint and importPath",
    ),
    (
        "code-without-import-path",
        _with(FJ, spec__workload__code={"configMap": "my-code"}),
        "spec.workload.code",
        "set importPath (package.module:Class) or remove code",
    ),
    (
        "code-path-escapes-storage",
        _with(FJ, spec__workload={"kind": "inference", "importPath": "m:C", "code": {"path": "code/../../etc"}}),
        "spec.workload.code.path",
        "must be relative to the fill storage and must not contain '..'",
    ),
    (
        "code-path-and-config-map",
        _with(FJ, spec__workload={"kind": "inference", "importPath": "m:C", "code": {"path": "c", "configMap": "c"}}),
        "spec.workload.code",
        "set exactly one of path and configMap",
    ),
    (
        "bad-import-path",
        _with(FJ, spec__workload={"kind": "training", "importPath": "not a path"}),
        "spec.workload.importPath",
        "should match",
    ),
    ("builtin-kind-mismatch", _with(FJ, spec__workload__kind="training"), "spec.workload.kind", "set kind: inference"),
    ("samples-and-steps", _with(FJ, spec__totalSteps=5), "spec", "exactly one of totalSamples and totalSteps"),
    (
        "inference-with-steps",
        _with(FJ, spec__totalSamples=DELETE, spec__totalSteps=5),
        "spec.totalSamples",
        "required for inference",
    ),
    ("missing-output", _with(FJ, spec__output=DELETE), "spec.output", "Required value"),
    ("too-many-ranks", _with(FJ, spec__maxParallelRanks=1025), "spec.maxParallelRanks", "less than or equal to 1024"),
    ("bad-deadline", _with(FJ, spec__deadline="tomorrow"), "spec.deadline", "RFC 3339"),
    (
        "selector-in-without-values",
        _with(FJ, spec__hostSelector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
        "spec.hostSelector.matchExpressions[0].values",
        "must be non-empty",
    ),
    ("absurd-priority", _with(FJ, spec__priority=5000), "spec.priority", "less than or equal to 1000"),
    (
        "input-on-another-claim",
        _with(
            FJ, spec__input={"path": "in.jsonl", "claimName": "other"}, spec__output={"path": "o", "claimName": "fs"}
        ),
        "spec.input.claimName",
        "must be spec.output.claimName",
    ),
    (
        "fill-storage-over-tmp",
        _with(PTJ, spec__fill={"storage": {"claimName": "fs", "mountPath": "/tmp"}}),
        "spec.fill.storage.mountPath",
        "must not be a path the fill sidecar mounts already",
    ),
    (
        "fill-storage-relative-mount",
        _with(PTJ, spec__fill={"storage": {"claimName": "fs", "mountPath": "fill"}}),
        "spec.fill.storage.mountPath",
        "should match",
    ),
    (
        "fill-job-selector-in-without-values",
        _with(PTJ, spec__fill={"jobSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
        "spec.fill.jobSelector.matchExpressions[0].values",
        "must be non-empty",
    ),
    (
        "unknown-work-kind",
        _with(FJ, spec__workload__kind="batch"),
        "spec.workload.kind",
        'supported values: "inference", "training"',
    ),
]


@pytest.mark.parametrize(("manifest", "field", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_by_crd_schema_and_loader_with_the_same_message(
    manifest: dict[str, Any], field: str, rule: str
) -> None:
    obj = copy.deepcopy(manifest)
    crd_errors = check_object(_crd_schema(obj["kind"]), obj)
    assert any(e.path == field and rule in e.text for e in crd_errors), crd_errors

    with pytest.raises(SpecError) as caught:
        parse(manifest, source="case.yaml")
    loader_texts = [e.text for e in caught.value.errors]
    assert [e.text for e in crd_errors] == loader_texts
    assert f'{manifest["kind"]} "{manifest["metadata"]["name"]}" is invalid (case.yaml)' in str(caught.value)


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25


def test_the_unmodified_bases_are_valid() -> None:
    assert parse(PTJ).spec.pipeline.stages == 2
    assert parse(FJ).spec.total == 100


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("spec: [unclosed", "not valid YAML at line"),
        ("just a string", "document 1 is a str, expected a manifest"),
        ("a: 1\na: 2\n", "duplicate key 'a' (line 2)"),
        ("- 1\n- 2\n", "document 1 is a list"),
    ],
)
def test_non_yaml_input_gets_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=r"manifest\.yaml") as caught:
        parse_yaml(text, source="manifest.yaml")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"apiVersion": "pipefill.io/v1"}, "this release serves pipefill.io/v1alpha1"),
        ({"kind": "TrainingJob"}, 'supported values: "PipelineTrainingJob", "FillJob"'),
        ({"metadata": {}}, "metadata.name: Required value"),
    ],
)
def test_envelope_errors(change: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse({**PTJ, **change})
    assert words in str(caught.value)


def test_cancel_cannot_be_undone_but_suspend_can() -> None:
    """Transition rules (``oldSelf``): a cancelled FillJob stays cancelled; suspend goes both ways."""
    schema = _crd_schema("FillJob")
    cancelled = _with(FJ, spec__cancel=True)
    errors = check_object(schema, _with(FJ, spec__cancel=False), old=cancelled)
    assert [(e.path, "cannot be set back to false" in e.text) for e in errors] == [("spec.cancel", True)]
    assert check_object(schema, _with(FJ, spec__cancel=True), old=_with(FJ)) == []
    assert check_object(schema, _with(FJ, spec__suspend=False), old=_with(FJ, spec__suspend=True)) == []


def test_status_fields_round_trip_through_the_typed_model() -> None:
    """What the operator and the executors write into ``status`` is a valid, typed FillJobStatus."""
    status = {
        "phase": "Running",
        "slices": [{"start": 0, "end": 64, "committed": 10}, {"start": 64, "end": 128, "committed": 64}],
        "assignments": [
            {"trainingJob": "gpt", "rank": 1, "start": 0, "end": 64, "pod": "gpt-0-1", "podUID": "u-1", "epoch": 3}
        ],
        "epoch": 3,
        "unfit": [{"trainingJob": "gpt", "rank": 0, "reason": "NotEnoughMemory", "freeBytes": 1, "peakMemoryBytes": 2}],
        "profile": [{"batchSize": 8, "stepMilliseconds": 2.5, "peakMemoryBytes": 1024}],
        "bubbleClasses": [
            {"trainingJob": "gpt", "rank": 1, "classes": [{"durationMilliseconds": 4.0, "perStep": 2, "freeBytes": 9}]}
        ],
        "message": "running on 1 rank",
    }
    obj = _with(FJ, status=status)
    assert check_object(_crd_schema("FillJob"), copy.deepcopy(obj)) == []
    parsed = from_obj(FillJobStatus, status)
    assert parsed.assignments[0].pod_uid == "u-1" and parsed.slices[1].committed == 64
    assert parsed.unfit[0].reason == "NotEnoughMemory" and parsed.bubble_classes[0].classes[0].per_step == 2.0
    bad = _with(FJ, status={"slices": [{"start": 0, "end": 64, "committed": 65}]})
    errors = check_object(_crd_schema("FillJob"), bad)
    assert any(e.path == "status.slices[0].committed" and "committed 65 must lie within" in e.text for e in errors)
