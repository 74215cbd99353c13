"""Every malformed manifest of the corpus and every example, sent to the real API server and to ``pipefill.spec``.

The API server gets each manifest as a server-side dry-run create with ``fieldValidation=Strict`` (what ``kubectl
apply --validate=strict`` does). For a case admission must reject, both layers reject it and name the same set of
field paths; every example is accepted by both.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from malformed_cases import CASES, FJ, PTJ, changed

from pipefill.devcluster import ControlPlane
from pipefill.spec import SpecError, parse

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


_PLURAL = {"PipelineTrainingJob": "pipelinetrainingjobs", "FillJob": "filljobs"}
_UNKNOWN = re.compile(r'unknown field "([^"]+)"')


@pytest.fixture(scope="module")
def custom(control_plane: ControlPlane) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(control_plane.kubeconfig)))


def server_rejects(api: client.CustomObjectsApi, manifest: dict[str, Any]) -> set[str]:
    """The field paths the API server names when it rejects ``manifest``; empty when it accepts it."""
    try:
        api.create_namespaced_custom_object(
            "pipefill.io",
            "v1alpha1",
            "default",
            _PLURAL[manifest["kind"]],
            copy.deepcopy(manifest),
            dry_run="All",
            field_validation="Strict",
        )
    except ApiException as exc:
        status = json.loads(exc.body)
        fields = {_field(c) for c in (status.get("details") or {}).get("causes", [])} - {None}
        fields |= set(_UNKNOWN.findall(status.get("message", "")))
        assert fields, f"the API server rejected without naming a field: {status}"
        return fields
    return set()


def _field(cause: dict[str, str]) -> str | None:
    """The field a cause names. The API server reports root rules (which may only read metadata.name and cannot
    declare a fieldPath into metadata) and its note that further rules were skipped under the field "<nil>"."""
    field, message = cause.get("field") or "<nil>", cause.get("message", "")
    if field != "<nil>":
        return field
    if "some validation rules were not checked" in message:
        return None
    return "metadata.name" if "metadata.name" in message else field


def loader_rejects(manifest: dict[str, Any]) -> set[str]:
    try:
        parse(copy.deepcopy(manifest), source="case.yaml")
    except SpecError as exc:
        return {e.path for e in exc.errors}
    return set()


# Cases admission cannot hold (no CEL rule can say them): the API server accepts them, `pipefill validate` (and the
# operator, through the same pipefill.spec.shape checks) rejects them naming the field.
_PTJ: dict[str, Any] = PTJ
OPERATOR_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "layers-per-stage-sum",
        changed(_PTJ, spec__pipeline__layersPerStage=[1, 1]),
        "spec.pipeline.layersPerStage",
        "sum equal to the model's 4 layers",
    ),
    (
        "layers-per-stage-zero",
        changed(_PTJ, spec__pipeline__layersPerStage=[0, 4]),
        "spec.pipeline.layersPerStage",
        "needs every entry ≥ 1",
    ),
]
# Which layer must reject each case: "admission" (the CRD's schema and CEL rules; both layers) or "operator".
LAYER: dict[str, str] = {case_id: "admission" for case_id, *_ in CASES} | {c[0]: "operator" for c in OPERATOR_CASES}


ALL_CASES = CASES + OPERATOR_CASES


@pytest.mark.parametrize(("case_id", "manifest", "field"), [c[:3] for c in ALL_CASES], ids=[c[0] for c in ALL_CASES])
def test_both_layers_agree_on_each_malformed_manifest(
    custom: client.CustomObjectsApi, case_id: str, manifest: dict[str, Any], field: str
) -> None:
    server, local = server_rejects(custom, manifest), loader_rejects(manifest)
    assert field in local
    rule = next(c[3] for c in ALL_CASES if c[0] == case_id)
    with pytest.raises(SpecError, match=re.escape(rule)):
        parse(copy.deepcopy(manifest))
    if LAYER[case_id] == "admission":
        assert server == local, f"API server names {sorted(server)}, pipefill.spec names {sorted(local)}"
    else:
        assert server == set()


EXAMPLES = [
    pytest.param(doc, id=f"{path.name}:{doc['metadata']['name']}")
    for path in sorted((ROOT / "examples").glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc and doc.get("apiVersion") == "pipefill.io/v1alpha1"
]


@pytest.mark.parametrize("manifest", EXAMPLES)
def test_every_example_is_accepted_by_both(custom: client.CustomObjectsApi, manifest: dict[str, Any]) -> None:
    assert server_rejects(custom, manifest) == set()
    assert loader_rejects(manifest) == set()


# (id, spec changes of an update, field paths both layers must name; empty: the update is allowed)
UPDATES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("total-samples", {"totalSamples": 200}, {"spec.totalSamples"}),
    ("max-parallel-ranks", {"maxParallelRanks": 4}, {"spec.maxParallelRanks"}),
    ("min-slice-samples", {"minSliceSamples": 64}, {"spec.minSliceSamples"}),
    ("output", {"output": {"path": "/elsewhere"}}, {"spec.output"}),
    ("priority-is-mutable", {"priority": 10}, set()),
]


@pytest.mark.parametrize(("changes", "fields"), [u[1:] for u in UPDATES], ids=[u[0] for u in UPDATES])
def test_update_only_rules_agree(
    custom: client.CustomObjectsApi, namespace: str, changes: dict[str, Any], fields: set[str]
) -> None:
    old = copy.deepcopy(FJ)
    custom.create_namespaced_custom_object("pipefill.io", "v1alpha1", namespace, "filljobs", old)
    new = copy.deepcopy(FJ)
    new["spec"].update(changes)
    server: set[str] = set()
    try:
        custom.patch_namespaced_custom_object(
            "pipefill.io", "v1alpha1", namespace, "filljobs", FJ["metadata"]["name"], {"spec": changes}, dry_run="All"
        )
    except ApiException as exc:
        server = {_field(c) for c in json.loads(exc.body)["details"]["causes"]} - {None}
    try:
        parse(copy.deepcopy(new), old=copy.deepcopy(old))
        local: set[str] = set()
    except SpecError as exc:
        local = {e.path for e in exc.errors}
    assert server == local == fields
    assert loader_rejects(new) == set(), "update-only rules must not apply on create"
