"""Malformed manifests are rejected by the CRD's schema and CEL rules and by the Python loader, with one message.

Each case is checked twice: against the CRD YAML committed in crds/ (the schema the API server gets, CEL rules run
by a CEL library) and through ``pipefill.spec.parse`` (what ``pipefill local`` and the operator use).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from malformed_cases import CASES, FJ, PTJ, changed, crd_schema

from pipefill.spec import FillJobStatus, SpecError, parse, parse_yaml
from pipefill.spec._schema import from_obj
from pipefill.spec.validation import check_object


@pytest.mark.parametrize(("manifest", "field", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_by_crd_schema_and_loader_with_the_same_message(
    manifest: dict[str, Any], field: str, rule: str
) -> None:
    obj = copy.deepcopy(manifest)
    crd_errors = check_object(crd_schema(obj["kind"]), obj)
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
    schema = crd_schema("FillJob")
    cancelled = changed(FJ, spec__cancel=True)
    errors = check_object(schema, changed(FJ, spec__cancel=False), old=cancelled)
    assert [(e.path, "cannot be set back to false" in e.text) for e in errors] == [("spec.cancel", True)]
    assert check_object(schema, changed(FJ, spec__cancel=True), old=changed(FJ)) == []
    assert check_object(schema, changed(FJ, spec__suspend=False), old=changed(FJ, spec__suspend=True)) == []


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
    obj = changed(FJ, status=status)
    assert check_object(crd_schema("FillJob"), copy.deepcopy(obj)) == []
    parsed = from_obj(FillJobStatus, status)
    assert parsed.assignments[0].pod_uid == "u-1" and parsed.slices[1].committed == 64
    assert parsed.unfit[0].reason == "NotEnoughMemory" and parsed.bubble_classes[0].classes[0].per_step == 2.0
    bad = changed(FJ, status={"slices": [{"start": 0, "end": 64, "committed": 65}]})
    errors = check_object(crd_schema("FillJob"), bad)
    assert any(e.path == "status.slices[0].committed" and "committed 65 must lie within" in e.text for e in errors)
