"""Which edits of a stored PipelineTrainingJob's spec admission refuses (update-only CEL rules, ``oldSelf``), judged
by ``pipefill.spec.parse(new, old=...)`` against the CRD's own rules; the same table goes to a real API server in
tests/cluster/test_spec_update_admission.py. A refusal names the field, says why and what to do instead."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from malformed_cases import PTJ, crd_schema
from update_cases import UPDATES, merged

from pipefill.spec import SpecError, parse
from pipefill.spec.validation import check_object


def _refused(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """field path -> message of each violation of the update ``old`` -> ``new``."""
    try:
        parse(copy.deepcopy(new), old=copy.deepcopy(old))
    except SpecError as exc:
        return {e.path: e.text for e in exc.errors}
    return {}


@pytest.mark.parametrize(("old", "patch", "fields"), [u[1:] for u in UPDATES], ids=[u[0] for u in UPDATES])
def test_an_update_is_refused_exactly_on_the_immutable_fields(
    old: dict[str, Any], patch: dict[str, Any], fields: set[str]
) -> None:
    new = merged(old, {"spec": patch})
    parse(copy.deepcopy(new))  # valid as a new job: only the change is refused
    refused = _refused(old, new)
    assert set(refused) == fields
    for path, text in refused.items():
        assert text.startswith(f"{path}: Invalid value")
        # the field, why, and what to do instead
        assert f"{path} is immutable" in text or f"{path} and" in text or f"{path} cannot" in text, text
        assert "create" in text or "new job" in text, text


def test_a_refusal_names_the_field_the_reason_and_the_fix() -> None:
    refused = _refused(PTJ, merged(PTJ, {"spec": {"pipeline": {"stages": 4}}}))
    assert list(refused) == ["spec.pipeline.stages"]
    text = refused["spec.pipeline.stages"]
    assert "Invalid value: 4" in text
    assert "spec.pipeline.stages is immutable: the job's pods (stages × dataParallel) size its PodGroup" in text
    assert "delete the job and create it again (checkpoints of format dcp reshard onto the new layout)" in text


def test_an_unchanged_spec_passes_every_update_rule() -> None:
    """Every transition rule holds for old == new, also with the optional parts set (a rule that refused an
    unchanged field would refuse every status-less update, e.g. a label change)."""
    full = merged(
        PTJ,
        {
            "spec": {
                "checkpoint": {"claimName": "ckpt", "format": "dcp"},
                "scheduling": {"gang": "volcano", "gangMinMembers": 2, "priorityClassName": "high"},
                "gpuSharing": {"mps": {"enabled": True}},
                "pipeline": {"layersPerStage": [2, 2]},
            }
        },
    )
    parse(copy.deepcopy(full), old=copy.deepcopy(full))
    parse(copy.deepcopy(full), old=merged(full, {"metadata": {"labels": {"team": "a"}}}))


def test_update_rules_do_not_apply_on_create() -> None:
    schema = crd_schema("PipelineTrainingJob")
    for _, old, patch, _ in UPDATES:
        assert check_object(schema, merged(old, {"spec": patch})) == []
