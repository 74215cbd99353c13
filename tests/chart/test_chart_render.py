"""The chart as helm renders it (no cluster): `helm lint --strict`, the objects for the value combinations that
matter, the operator's rules taken verbatim from its derived ClusterRole, the CRDs generated from the spec, the
monitors checked against the pods and Service they must select, and every impossible value refused.

PodMonitor and ServiceMonitor are checked here only: the test control plane does not serve the Prometheus
Operator's API (docs/operations.md, "Rendered-only objects").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import CHART, MONITORING, RELEASE_NAMESPACE, ROOT, by_kind, helm, one, render, render_error
from operator_harness import job_manifest

from pipefill.cli.crds import render_chart
from pipefill.lifecycle.checks import checkpoint_sharing
from pipefill.pods import rank_pod
from pipefill.spec import KINDS, crd, parse

OPERATOR_RULES = yaml.safe_load((ROOT / "operator" / "rbac" / "clusterrole.yaml").read_text())["rules"]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
Grant = tuple[str, str, str]


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"operator": {"namespaces": ["team-a", "team-b"], "liveness": {"enabled": False}}},
        {"crds": {"install": False}, "rbac": {"create": False}, "serviceAccount": {"create": False, "name": "op"}},
        {"dashboards": {"enabled": True, "namespace": "grafana"}, "operator": {"metrics": {"enabled": False}}},
    ],
    ids=["defaults", "namespaced", "bring-your-own", "dashboards"],
)
def test_helm_lint_strict_passes(values: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    proc = helm("lint", "--strict", str(CHART), "--namespace", RELEASE_NAMESPACE, "-f", str(path))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_defaults_install_the_operator_for_all_namespaces_with_its_derived_cluster_role(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        ["CustomResourceDefinition"] * 2
        + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"]
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    )
    policy, policy_binding = one(objs, "ValidatingAdmissionPolicy"), one(objs, "ValidatingAdmissionPolicyBinding")
    assert policy_binding["spec"]["validationActions"] == ["Warn"] and policy["spec"]["failurePolicy"] == "Ignore"
    assert "matchResources" not in policy_binding["spec"]  # every namespace, as the operator serves
    (rule,) = policy["spec"]["validations"]
    job = parse(job_manifest())  # 2 ranks, no checkpoint claim
    assert " ".join(rule["message"].split()) == checkpoint_sharing(job, None)[2]  # the operator's words
    assert not by_kind(render({"admissionPolicy": {"enabled": False}}, tmp_path), "ValidatingAdmissionPolicy")
    role, binding, sa = one(objs, "ClusterRole"), one(objs, "ClusterRoleBinding"), one(objs, "ServiceAccount")
    assert role["rules"] == OPERATOR_RULES  # verbatim, in the same order
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pf-pipefill-operator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": RELEASE_NAMESPACE}
    ]
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_a_namespaced_install_splits_the_derived_rules_by_scope_and_drops_the_node_watch(tmp_path: Path) -> None:
    objs = render({"operator": {"namespaces": ["team-a", "team-b"]}}, tmp_path)
    roles, bindings = by_kind(objs, "Role"), by_kind(objs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"]["kind"] == "Role" and b["subjects"][0]["namespace"] == RELEASE_NAMESPACE for b in bindings)
    namespaced = grants(roles[0]["rules"])
    assert grants(roles[1]["rules"]) == namespaced
    cluster = grants(one(objs, "ClusterRole")["rules"])
    node_watch = {g for g in grants(OPERATOR_RULES) if g[1] == "nodes"}
    assert node_watch  # the derived role has it: the cluster-wide operator watches nodes
    assert not namespaced & cluster
    assert namespaced | cluster | node_watch == grants(OPERATOR_RULES)
    assert cluster == {("resource.k8s.io", "deviceclasses", "get")}  # the DRA prerequisite check
    deployment = one(objs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--namespace=team-a", "--namespace=team-b"]
    # the apply-time warnings of the namespaces it serves, and of no other team's
    selector = one(objs, "ValidatingAdmissionPolicyBinding")["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]
    }


def test_without_rbac_and_service_account_the_operator_runs_as_the_named_account(tmp_path: Path) -> None:
    objs = render(
        {
            "crds": {"install": False},
            "rbac": {"create": False},
            "serviceAccount": {"create": False, "name": "op"},
            "admissionPolicy": {"enabled": False},
        },
        tmp_path,
    )
    assert sorted(o["kind"] for o in objs) == ["Deployment", "Service"]
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "op"


def _operator_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_deployment_is_one_recreated_non_root_pod_with_the_images_writable_paths(tmp_path: Path) -> None:
    objs = render({}, tmp_path)
    deployment = one(objs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    container = _operator_container(objs)
    assert (
        container["image"]
        == f"ghcr.io/pipefill/operator:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    )
    assert container["command"] == ["python", "-m", "pipefill_operator"]
    assert container["args"] == [
        "--workers=8",
        "--status-interval=30",
        "--status-rate=100",
        "--metrics-address=$(POD_IP):9402",
        "--liveness=http://$(POD_IP):8080/healthz",
        "--admission-warnings",
    ]
    assert container["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    # docs/operations.md, "User and writable paths": the numeric user, a read-only root, the four emptyDirs.
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == 65532
    assert pod["securityContext"]["fsGroup"] == 65532 and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    listed = OPERATIONS.split("<!-- tests/images checks this list")[1].split("\n\n")[0]
    documented = set(re.findall(r"^- `(/[^`]+)`$", listed, re.MULTILINE))
    assert len(documented) == 4
    assert {m["mountPath"] for m in container["volumeMounts"]} == documented
    assert all("emptyDir" in v for v in pod["volumes"])
    service = one(objs, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9402, "targetPort": "metrics", "protocol": "TCP"}]


def test_operator_values_become_its_arguments(tmp_path: Path) -> None:
    values = {
        "operator": {
            "replicas": 0,
            "namespaces": ["ml"],
            "workers": 3,
            "statusIntervalSeconds": 2.5,
            "statusReadsPerSecond": 400,
            "policy": "makespan",
            "verbose": True,
            "ipFamily": "IPv6",
            "liveness": {"port": 8081},
            "metrics": {"port": 9500},
        },
        "image": {"repository": "registry.example/pipefill-operator", "tag": "dev"},
    }
    objs = render(values, tmp_path)
    container = _operator_container(objs)
    assert one(objs, "Deployment")["spec"]["replicas"] == 0
    assert container["image"] == "registry.example/pipefill-operator:dev"
    assert container["args"] == [
        "--namespace=ml",
        "--workers=3",
        "--status-interval=2.5",
        "--status-rate=400",
        "--policy=makespan",
        "--metrics-address=$(POD_IP):9500",
        "--liveness=http://[$(POD_IP)]:8081/healthz",
        "--admission-warnings",
        "--verbose",
    ]
    assert [p["containerPort"] for p in container["ports"]] == [9500, 8081]
    off = _operator_container(
        render(
            {
                "operator": {"metrics": {"enabled": False}, "liveness": {"enabled": False}},
                "admissionPolicy": {"enabled": False},
            },
            tmp_path,
        )
    )
    assert off["args"] == ["--workers=8", "--status-interval=30", "--status-rate=100", "--metrics-address=127.0.0.1:0"]
    assert "ports" not in off and "livenessProbe" not in off


def test_on_a_cluster_without_a_pod_network_the_operator_uses_the_nodes_and_the_given_api_address(
    tmp_path: Path,
) -> None:
    """The dev cluster's real node (`make e2e`): hostNetwork, and KUBERNETES_SERVICE_* pointing at the API server,
    since no kube-proxy routes the `kubernetes` Service's address."""
    api = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
    ]
    objs = render({"operator": {"hostNetwork": True, "extraEnv": api}}, tmp_path)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert _operator_container(objs)["env"][1:] == api
    default = one(render({}, tmp_path), "Deployment")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default and "dnsPolicy" not in default


def test_the_crd_templates_are_the_crds_generated_from_the_spec(tmp_path: Path) -> None:
    templates = CHART / "templates" / "crds"
    assert {p.name: p.read_text() for p in templates.glob("*.yaml")} == render_chart()
    assert not (CHART / "crds").exists()  # one place: Helm would install a crds/ folder once and never upgrade it
    objs = by_kind(render({}, tmp_path), "CustomResourceDefinition")
    assert sorted(o["metadata"]["name"] for o in objs) == sorted(crd(k)["metadata"]["name"] for k in KINDS)
    for obj in objs:
        kind = obj["spec"]["names"]["kind"]
        assert obj["spec"] == crd(kind)["spec"]
        assert obj["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pipefill"
    unkept = by_kind(render({"crds": {"keep": False}}, tmp_path), "CustomResourceDefinition")
    assert len(unkept) == 2 and all("annotations" not in o["metadata"] for o in unkept)
    assert by_kind(render({"crds": {"install": False}}, tmp_path), "CustomResourceDefinition") == []


def _job(**spec: Any) -> Any:
    return parse(job_manifest("llm", gpuSharing={"mode": "dra"}, **spec))


def _meta_label(name: str) -> str:
    """Prometheus' Kubernetes discovery label of pod label ``name`` (non-alphanumerics become ``_``)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "Exists", expr
        if expr["key"] not in labels:
            return False
    return True


@pytest.mark.parametrize("host_network", [False, True])
def test_the_pod_monitor_scrapes_both_containers_of_every_rank_pod_and_labels_them(
    host_network: bool, tmp_path: Path
) -> None:
    objs = render(
        {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
        tmp_path,
        api_versions=(MONITORING,),
    )
    monitor = one(objs, "PodMonitor")
    assert monitor["apiVersion"] == MONITORING and monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    job = _job(podTemplate={"hostNetwork": host_network})
    for rank in range(2):
        pod = rank_pod(job, rank, namespace="ml")
        labels = pod["metadata"]["labels"]
        assert _selects(monitor["spec"]["selector"], labels)
        containers = {c["name"]: c for c in [*pod["spec"]["containers"], *pod["spec"]["initContainers"]]}
        ports = {p["name"]: name for name, c in containers.items() for p in c["ports"]}
        endpoints = monitor["spec"]["podMetricsEndpoints"]
        assert {ports[e["port"]] for e in endpoints} == {"trainer", "fill-executor"}
        for endpoint in endpoints:
            relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
            # docs/dashboards.md: the labels the dashboards select on, from these pod labels and the container.
            assert relabel == {
                "training_job": [_meta_label("pipefill.io/job-name")],
                "rank": [_meta_label("pipefill.io/rank")],
                "container": ["__meta_kubernetes_pod_container_name"],
            }
            assert labels["pipefill.io/job-name"] == "llm" and labels["pipefill.io/rank"] == str(rank)
    # The operator's own pod is not a rank pod.
    operator_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not _selects(monitor["spec"]["selector"], operator_labels)
    scoped = one(
        render(
            {"operator": {"namespaces": ["ml"]}, "monitoring": {"podMonitor": {"enabled": True}}},
            tmp_path,
            api_versions=(MONITORING,),
        ),
        "PodMonitor",
    )
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}


def test_the_service_monitor_scrapes_the_operators_metrics_service(tmp_path: Path) -> None:
    objs = render(
        {"monitoring": {"serviceMonitor": {"enabled": True, "interval": "1m"}}}, tmp_path, api_versions=(MONITORING,)
    )
    monitor, service = one(objs, "ServiceMonitor"), one(objs, "Service")
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "1m"}]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert _selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    rank_labels = rank_pod(_job(), 0)["metadata"]["labels"]
    assert not _selects({"matchLabels": service["spec"]["selector"]}, rank_labels)


def test_dashboards_ship_as_configmaps_for_grafanas_sidecar(tmp_path: Path) -> None:
    assert by_kind(render({}, tmp_path), "ConfigMap") == []
    values = {"dashboards": {"enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "PipeFill"}}}
    maps = by_kind(render(values, tmp_path), "ConfigMap")
    files = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    assert len(files) == 3
    assert {name for m in maps for name in m["data"]} == set(files)
    for cm in maps:
        ((name, text),) = cm["data"].items()
        assert text == files[name].rstrip("\n")  # a block scalar keeps the JSON exactly, less the final newline
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "PipeFill"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 2}}, "ERROR: operator.replicas=2: the operator runs standalone"),
        (
            {"operator": {"liveness": {"port": 9402}}},
            "ERROR: operator.metrics.port and operator.liveness.port are both 9402",
        ),
        ({"serviceAccount": {"create": False}}, "ERROR: serviceAccount.create=false needs serviceAccount.name"),
        (
            {"operator": {"metrics": {"enabled": False}}, "monitoring": {"serviceMonitor": {"enabled": True}}},
            "ERROR: monitoring.serviceMonitor.enabled=true needs operator.metrics.enabled=true",
        ),
    ],
    ids=["replicas", "same-port", "no-account", "monitor-without-metrics"],
)
def test_impossible_values_are_refused_naming_them(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in render_error(values, tmp_path, api_versions=(MONITORING,))


def test_the_prometheus_rule_holds_the_rule_file_as_it_is(tmp_path: Path) -> None:
    assert by_kind(render({}, tmp_path, api_versions=(MONITORING,)), "PrometheusRule") == []
    values = {"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}}
    rule = one(render(values, tmp_path, api_versions=(MONITORING,)), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "rules" / "pipefill.rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["namespace"] == RELEASE_NAMESPACE


def test_monitors_are_refused_where_the_prometheus_operator_api_is_not_served(tmp_path: Path) -> None:
    for monitor in ("serviceMonitor", "podMonitor", "prometheusRule"):
        error = render_error({"monitoring": {monitor: {"enabled": True}}}, tmp_path)
        assert "needs the Prometheus Operator's API monitoring.coreos.com/v1" in error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"workers": 0}}, "at '/operator/workers': minimum: got 0, want 1"),
        ({"operator": {"statusIntervalSeconds": 0}}, "at '/operator/statusIntervalSeconds'"),
        ({"operator": {"policy": "lifo"}}, "at '/operator/policy'"),
        ({"operator": {"ipFamily": "IPv5"}}, "at '/operator/ipFamily'"),
        ({"operator": {"namespaces": ["a", "a"]}}, "at '/operator/namespaces'"),
        ({"operator": {"namespaces": ["Team_A"]}}, "at '/operator/namespaces/0'"),
        ({"operator": {"workres": 4}}, "additional properties 'workres' not allowed"),
        ({"monitoring": {"podMonitor": {"interval": "often"}}}, "at '/monitoring/podMonitor/interval'"),
        ({"dashboards": {"labels": {"grafana_dashboard": "0"}}}, "at '/dashboards/labels'"),
        (
            {"operator": {"podLabels": {"app.kubernetes.io/component": "x"}}},
            "invalid propertyName 'app.kubernetes.io/component'",
        ),
    ],
)
def test_the_schema_refuses_malformed_values(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in render_error(values, tmp_path)


def test_every_value_is_documented_in_values_yaml_and_known_to_the_schema() -> None:
    """Each value (a key the schema describes without properties of its own) has a comment right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    schema = json.loads((CHART / "values.schema.json").read_text())
    undocumented, unknown = [], []
    path: list[tuple[int, str, Any]] = []
    for i, line in enumerate(lines):
        match = re.match(r"^( *)(\w+):", line)
        if not match:
            continue
        indent, key = len(match[1]), match[2]
        path = [p for p in path if p[0] < indent]
        parent = path[-1][2] if path else schema
        if parent is None or "properties" not in parent:
            path.append((indent, key, None))  # inside a free-form value (resources, securityContext, …)
            continue
        node = parent["properties"].get(key)
        path.append((indent, key, node))
        name = ".".join(p[1] for p in path)
        if node is None:
            unknown.append(name)
        elif "properties" not in node and not lines[i - 1].lstrip().startswith("#"):
            undocumented.append(name)
    assert undocumented == [] and unknown == []
