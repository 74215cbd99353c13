"""Edits of a stored PipelineTrainingJob sent to the real API server: the immutable fields' refusals name the field
and say what to do instead, the same as ``pipefill.spec.parse(new, old=...)``; the allowed edits are stored (the
table: tests/update_cases.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from update_cases import UPDATES, merged

from pipefill.devcluster import ControlPlane
from pipefill.spec import SpecError, parse

pytestmark = pytest.mark.cluster

_GROUP, _VERSION, _PLURAL = "pipefill.io", "v1alpha1", "pipelinetrainingjobs"


@pytest.fixture(scope="module")
def custom(control_plane: ControlPlane) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(control_plane.kubeconfig)))


def _server_refuses(api: client.CustomObjectsApi, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, str]:
    """field path -> message of each cause of the API server's refusal of the merge patch; empty: it was stored."""
    try:
        api.patch_namespaced_custom_object(_GROUP, _VERSION, namespace, _PLURAL, name, {"spec": patch})
    except ApiException as exc:
        assert exc.status == 422, exc.body
        causes = json.loads(exc.body)["details"]["causes"]
        return {c["field"]: c["message"] for c in causes}
    return {}


@pytest.mark.parametrize(("old", "patch", "fields"), [u[1:] for u in UPDATES], ids=[u[0] for u in UPDATES])
def test_the_api_server_refuses_exactly_the_immutable_fields_as_the_loader_does(
    custom: client.CustomObjectsApi, namespace: str, old: dict[str, Any], patch: dict[str, Any], fields: set[str]
) -> None:
    name = old["metadata"]["name"]
    before = custom.create_namespaced_custom_object(_GROUP, _VERSION, namespace, _PLURAL, copy.deepcopy(old))
    server = _server_refuses(custom, namespace, name, patch)
    try:
        parse(merged(old, {"spec": patch}), old=copy.deepcopy(old))
        local: set[str] = set()
    except SpecError as exc:
        local = {e.path for e in exc.errors}
    assert set(server) == local == fields
    for path, message in server.items():
        assert path in message and ("is immutable" in message or "cannot" in message), message
    stored = custom.get_namespaced_custom_object(_GROUP, _VERSION, namespace, _PLURAL, name)
    if fields:
        assert stored["spec"] == before["spec"]
    for key, value in _leaves(patch) if not fields else ():
        assert _get(stored["spec"], key) == value, key


def _leaves(patch: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in patch.items():
        if isinstance(value, dict):
            out += _leaves(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


def _get(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj
