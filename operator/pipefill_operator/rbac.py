"""The operator's ClusterRole, derived from evidence: the API requests it made, as the audit log recorded them.

``python -m pipefill_operator.rbac AUDIT_LOG USER`` prints the ClusterRole that grants exactly the verbs ``USER``
used on each resource (``operator/rbac/clusterrole.yaml`` is its output for the operator's RBAC test run), plus two
grants no request shows: the verbs of the fill executor's Role (RBAC lets a subject create a Role only with
permissions it holds itself), and ``update`` on ``pipelinetrainingjobs/finalizers`` (the ownerReferences of the
children set ``blockOwnerDeletion``, which clusters with the OwnerReferencesPermissionEnforcement admission plugin
only allow to who may update the owner's finalizers).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from pipefill.children import FILL_RULES

__all__ = ["EXTRA_RULES", "cluster_role", "rules_from_audit"]

NAME = "pipefill-operator"
EXTRA_RULES: list[dict[str, Any]] = [
    *FILL_RULES,
    {"apiGroups": ["pipefill.io"], "resources": ["pipelinetrainingjobs/finalizers"], "verbs": ["update"]},
]


def _grants(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _rules(grants: set[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """One rule per API group and verb set, resources sorted: stable output for a committed file."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in grants:
        verbs.setdefault((group, resource), set()).add(verb)
    merged: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), vs in verbs.items():
        merged.setdefault((group, tuple(sorted(vs))), []).append(resource)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(vs)}
        for (group, vs), resources in sorted(merged.items())
    ]


def rules_from_audit(events: Iterable[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    """The rules ``user``'s resource requests needed (discovery and other non-resource URLs need none)."""
    grants = set()
    for event in events:
        ref = event.get("objectRef")
        if (event.get("user") or {}).get("username") != user or not ref or not ref.get("resource"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        grants.add((ref.get("apiGroup", ""), resource, event["verb"]))
    return _rules(grants | _grants(EXTRA_RULES))


def cluster_role(rules: list[dict[str, Any]], *, name: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pipefill"}},
        "rules": rules,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m pipefill_operator.rbac AUDIT_LOG USER  (USER: system:serviceaccount:NS:NAME)")
        return 2
    lines = Path(args[0]).read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    header = "# Derived from the audit log of the operator's RBAC test run (tests/operator/test_rbac.py):\n"
    header += "# python -m pipefill_operator.rbac AUDIT_LOG USER. Do not edit by hand.\n"
    sys.stdout.write(header + yaml.safe_dump(cluster_role(rules_from_audit(events, args[1])), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
