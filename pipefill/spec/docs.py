"""``docs/api.md``, generated from the spec models so the reference cannot drift from the schema."""

from __future__ import annotations

import json
from typing import Any

from pipefill.spec.crd import KINDS, object_schema

__all__ = ["api_reference"]


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if node.get("type") == "array":
        return f"[]{_type(node['items'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return str(node.get("type", "any"))


def _rules(node: dict[str, Any], where: str) -> list[str]:
    return [f"- `{where}`: {r['message']} — CEL `{r['rule']}`" for r in node.get("x-kubernetes-validations", ())]


def _rows(node: dict[str, Any], prefix: str, out: list[str], rules: list[str]) -> None:
    rules.extend(_rules(node, prefix or "."))
    required = set(node.get("required", ()))
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        limits = []
        if "minimum" in child or "maximum" in child:
            low = child.get("minimum", "")
            limits.append(f"{'(' if child.get('exclusiveMinimum') else '['}{low}, {child.get('maximum', '∞')}]")
        for kw, label in (
            ("maxLength", "≤ {} chars"),
            ("maxItems", "≤ {} items"),
            ("pattern", "`{}`"),
            ("format", "{}"),
        ):
            if kw in child and not child.get("x-kubernetes-int-or-string") and child[kw] != "int64":
                limits.append(label.format(child[kw]))
        default = child.get("default")
        shown = "required" if key in required else ("—" if default is None else f"`{json.dumps(default)}`")
        doc = child.get("description", "").replace("|", "\\|")
        shown_limits = " ".join(limits).replace("|", "\\|")
        out.append(f"| `{path}` | {_type(child)} | {shown} | {shown_limits} | {doc} |")
        target = child["items"] if child.get("type") == "array" and "properties" in child.get("items", {}) else child
        if "properties" in target:
            _rows(target, path + ("[]" if target is not child else ""), out, rules)


def api_reference() -> str:
    """The Markdown reference of every field of both kinds."""
    lines = [
        "# API reference: pipefill.io/v1alpha1",
        "",
        "Generated from the spec models in `pipefill/spec/` by `make crds`; `make lint` fails when it is stale.",
        "Times and sizes carry their unit in the field name (`…Milliseconds`, `…Seconds`) or are Kubernetes",
        "quantities (`6Gi`). Defaults are applied by the API server (and by `pipefill local`) before the rules run.",
        "",
    ]
    for kind in KINDS:
        schema = object_schema(kind)
        for part in ("spec", "status"):
            rows: list[str] = []
            rules: list[str] = []
            _rows(schema["properties"][part], part, rows, rules)
            lines += [
                f"## {kind}.{part}",
                "",
                "| field | type | default | limits | meaning |",
                "|---|---|---|---|---|",
                *rows,
                "",
            ]
            if rules:
                lines += ["Cross-field rules (CEL, evaluated at admission and by the Python loader):", "", *rules, ""]
        lines += [
            f"`{kind}` objects also satisfy: "
            + "; ".join(r["message"] for r in schema.get("x-kubernetes-validations", ())),
            "",
        ]
    return "\n".join(lines)
