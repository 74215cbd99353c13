"""Reading the ConfigMap that holds a FillJob's code (``spec.workload.code.configMap``), from wherever the executor's
work comes from (``PIPEFILL_WORK_SOURCE``):

* ``kubernetes``: through the API, with the fill executor's ServiceAccount (its Role grants ``get`` on ConfigMaps of
  its namespace: :data:`pipefill.children.FILL_RULES`), in the FillJob's namespace;
* ``files:<dir>`` (``pipefill local``): the ConfigMap manifest ``<dir>/configmaps/<name>.yaml``, where ``pipefill
  local`` puts the ConfigMaps given with ``-f``.

Besides the work source, the only module of the executor that talks to the API server; the client is imported only
when a job's code is in a ConfigMap on a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from pipefill import env

__all__ = ["CONFIG_MAPS_DIR", "read_config_map"]

CONFIG_MAPS_DIR = "configmaps"  # under the files work source's directory


def read_config_map(name: str, *, namespace: str | None = None) -> dict[str, str]:
    """The ``data`` of ConfigMap ``name``; a ValueError naming the field and the fix when it cannot be read."""
    source = os.environ.get(env.WORK_SOURCE, "")
    if source.startswith("files:"):
        return _from_file(Path(source[len("files:") :]) / CONFIG_MAPS_DIR / f"{name}.yaml", name)
    if source == "kubernetes":
        return _from_api(name, namespace or _own_namespace())
    raise ValueError(
        f"spec.workload.code.configMap: {name!r}: this executor has no place to read ConfigMaps from "
        f"({env.WORK_SOURCE}={source!r}); run it with files:<dir> or kubernetes"
    )


def _from_file(path: Path, name: str) -> dict[str, str]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"spec.workload.code.configMap: ConfigMap {name!r} was not given ({path} does not exist); pass its "
            "manifest to pipefill local with -f"
        ) from None
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"spec.workload.code.configMap: {path} cannot be read ({exc})") from None
    return _data(doc, name, where=str(path))


def _data(doc: Any, name: str, *, where: str) -> dict[str, str]:
    if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap" or (doc.get("metadata") or {}).get("name") != name:
        raise ValueError(f"spec.workload.code.configMap: {where} is not ConfigMap {name!r}")
    data = doc.get("data") or {}
    if doc.get("binaryData"):
        raise ValueError(
            f"spec.workload.code.configMap: ConfigMap {name!r} holds binaryData; module files go in data (text)"
        )
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError(f"spec.workload.code.configMap: ConfigMap {name!r}: data must map file names to text")
    return dict(data)


def _from_api(name: str, namespace: str) -> dict[str, str]:
    from kubernetes import client, config  # only here: the executor needs the client for this and its work source
    from kubernetes.client.exceptions import ApiException

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]  # outside a cluster: the user's kubeconfig
    api = client.CoreV1Api()
    try:
        obj = api.read_namespaced_config_map(name, namespace)
    except ApiException as exc:
        fix = {
            404: f"create it (kubectl -n {namespace} create configmap {name} --from-file=MODULE.py)",
            403: f"the fill executor's ServiceAccount may not get ConfigMaps in {namespace}: grant get on configmaps",
        }.get(exc.status or 0, "check the API server, then create the FillJob again")
        raise ValueError(
            f"spec.workload.code.configMap: ConfigMap {namespace}/{name} cannot be read ({exc.status} {exc.reason}); "
            f"{fix}"
        ) from None
    doc = {
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": obj.data,
        "binaryData": obj.binary_data,
    }
    return _data(doc, name, where=f"ConfigMap {namespace}/{name}")


def _own_namespace() -> str:
    """The pod's namespace: FillJobs read from the API always name theirs, so this is only a fallback."""
    namespace = os.environ.get(env.POD_NAMESPACE, "")
    if not namespace:
        raise ValueError(
            f"spec.workload.code.configMap: the FillJob names no namespace and {env.POD_NAMESPACE} is unset; "
            "set it from the downward API (metadata.namespace)"
        )
    return namespace
