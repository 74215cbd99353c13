"""The generated CRDs are valid apiextensions.k8s.io/v1 objects with structural schemas, and the examples pass them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cel
import jsonschema
import kubernetes_validate
import pytest
import yaml

from pipefill.cli.crds import render, render_chart
from pipefill.spec import KINDS, crd, load_file, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSIONS = ["1.30", "1.34"]


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _structural_violations(schema: dict[str, Any]) -> list[str]:
    """The rules of https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema."""
    bad = []
    for path, node in _nodes(schema):
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        if "type" not in node and not int_or_string and not node.get("x-kubernetes-preserve-unknown-fields"):
            bad.append(f"{path or '<root>'}: no type")
        if "properties" in node and "additionalProperties" in node:
            bad.append(f"{path}: properties and additionalProperties together")
        for forbidden in (
            "$ref",
            "definitions",
            "dependencies",
            "patternProperties",
            "additionalItems",
            "oneOf",
            "allOf",
            "not",
        ):
            if forbidden in node:
                bad.append(f"{path}: {forbidden} is not allowed")
        if "anyOf" in node and (not int_or_string or node["anyOf"] != [{"type": "integer"}, {"type": "string"}]):
            bad.append(f"{path}: anyOf only in the int-or-string form")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            bad.append(f"{path}: arrays need one items schema")
    return bad


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_crd_is_a_valid_apiextensions_v1_object(kind: str, version: str) -> None:
    kubernetes_validate.validate(crd(kind), version, strict=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_schema_is_structural_and_defaults_satisfy_it(kind: str) -> None:
    schema = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _structural_violations(schema) == []
    for _, node in _nodes(schema):
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_cel_rule_and_message_expression_compiles(kind: str) -> None:
    schema = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r for _, node in _nodes(schema) for r in node.get("x-kubernetes-validations", ())]
    assert rules
    for rule in rules:
        cel.compile(rule["rule"])
        if "messageExpression" in rule:
            cel.compile(rule["messageExpression"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_printer_columns_point_into_the_schema(kind: str) -> None:
    version = crd(kind)["spec"]["versions"][0]
    paths = {p for p, _ in _nodes(version["schema"]["openAPIV3Schema"])}
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"] != ".metadata.creationTimestamp":
            assert column["jsonPath"] in paths, column


def test_committed_crds_match_the_models() -> None:
    for name, text in render().items():
        assert (ROOT / "crds" / name).read_text(encoding="utf-8") == text, f"run `make crds`: {name} is stale"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid_and_round_trip(path: Path) -> None:
    for manifest in load_file(path):
        again = parse(to_obj(manifest))
        assert again == manifest


def test_examples_cover_the_promised_cases() -> None:
    manifests = [m for p in sorted((ROOT / "examples").glob("*.yaml")) for m in load_file(p)]
    jobs = {m.name: m for m in manifests if m.kind == "PipelineTrainingJob"}
    fills = [m for m in manifests if m.kind == "FillJob"]
    assert jobs["cpu-demo"].spec.pipeline.stages == 2 and jobs["cpu-demo"].spec.resources.gpus == 0
    big = jobs["gpt-1-3b"].spec.pipeline
    assert (big.stages, big.schedule.value, big.virtual_stages) == (8, "interleaved-1f1b", 2)
    assert sorted(f.spec.workload.kind.value for f in fills) == ["inference", "inference", "training"]
    assert sorted(f.spec.workload.builtin or "" for f in fills) == [
        "encoder-inference",
        "sentence-embedding",
        "train-classifier",
    ]


def test_crd_yaml_files_parse_as_yaml() -> None:
    for path in (ROOT / "crds").glob("*.yaml"):
        assert yaml.safe_load(path.read_text())["kind"] == "CustomResourceDefinition"


def test_crds_check_fails_on_stale_or_missing_files_and_passes_after_write(tmp_path: Path) -> None:
    from pipefill.cli import main

    assert main(["crds", "--check", str(tmp_path)]) == 1
    assert main(["crds", "--write", str(tmp_path), "--docs", str(tmp_path / "api.md")]) == 0
    assert main(["crds", "--check", str(tmp_path), "--docs", str(tmp_path / "api.md")]) == 0
    stale = tmp_path / "pipefill.io_filljobs.yaml"
    stale.write_text(stale.read_text().replace("maxParallelRanks", "maxParallel"))
    assert main(["crds", "--check", str(tmp_path)]) == 1


def test_chart_ships_the_generated_crds() -> None:
    for name, text in render_chart().items():
        assert (ROOT / "charts" / "pipefill" / "templates" / "crds" / name).read_text(encoding="utf-8") == text


def test_crds_check_fails_on_a_chart_template_the_spec_does_not_generate(tmp_path: Path) -> None:
    from pipefill.cli import main

    chart = tmp_path / "chart"
    assert main(["crds", "--write", str(tmp_path), "--chart", str(chart)]) == 0
    assert main(["crds", "--check", str(tmp_path), "--chart", str(chart)]) == 0
    (chart / "pipefill.io_oldjobs.yaml").write_text("{{- if .Values.crds.install }}{{- end }}\n")
    assert main(["crds", "--check", str(tmp_path), "--chart", str(chart)]) == 1
