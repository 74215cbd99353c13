"""Admission-equivalent validation: the CRD's OpenAPI schema (via jsonschema) and its CEL rules (via a CEL library).

The API server validates a custom resource against the CRD's structural schema, applies schema defaults, and
evaluates the ``x-kubernetes-validations`` CEL rules. This module does the same with the very schema and rules the
CRD is generated from, so ``pipefill local`` and the operator reject what a cluster would, with the same message.
Every message names the field, the value, the rule and the fix.
"""

from __future__ import annotations

import copy
import datetime
import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cel
import jsonschema

__all__ = ["FieldError", "apply_defaults", "check_object", "strict_schema"]


@dataclass(frozen=True)
class FieldError:
    """One violation: ``path`` is the field (``spec.pipeline.stages``), ``text`` the whole message."""

    path: str
    text: str

    def __str__(self) -> str:
        return self.text


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy that rejects unknown fields, as ``kubectl apply --validate=strict`` does."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
            for child in node["properties"].values():
                walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(out)
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill in schema defaults top-down, as the API server does before validation rules run."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, child in schema["properties"].items():
            if key not in obj and "default" in child:
                obj[key] = copy.deepcopy(child["default"])
            if key in obj:
                apply_defaults(child, obj[key])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(schema["items"], item)
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for item in obj.values():
            apply_defaults(schema["additionalProperties"], item)
    return obj


def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return "T" in value


_FORMATS = jsonschema.FormatChecker(formats=())
_FORMATS.checks("date-time")(_is_datetime)


def _range_fix(schema: dict[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f"use a value from {low}{' (exclusive)' if schema.get('exclusiveMinimum') else ''} to {high}"
    return f"use a value >= {low}" if low is not None else f"use a value <= {high}"


def _schema_error(err: Any) -> FieldError:
    path = _path(err.absolute_path)
    schema, value, kw = err.schema, err.instance, err.validator
    doc = schema.get("description", "")
    if kw == "required":
        missing = next(k for k in err.validator_value if k not in value)
        field = f"{path}.{missing}" if path else missing
        sub = schema.get("properties", {}).get(missing, {}).get("description", "")
        return FieldError(field, f"{field}: Required value: add {field} ({sub})")
    if kw == "additionalProperties":
        known = list(schema.get("properties", {}))
        unknown = sorted(set(value) - set(known))[0]
        field = f"{path}.{unknown}" if path else unknown
        close = difflib.get_close_matches(unknown, known, n=1)
        hint = f'did you mean "{close[0]}"?' if close else "known fields: " + ", ".join(known)
        return FieldError(field, f'{field}: Unknown field "{unknown}": remove it or fix its spelling ({hint})')
    head = f"{path}: Invalid value: {_show(value)}"
    if kw == "type":
        want = schema["type"]
        return FieldError(
            path, f"{head}: must be of type {want}; write it as {'a' if want != 'integer' else 'an'} {want} ({doc})"
        )
    if kw in ("minimum", "maximum", "exclusiveMinimum"):
        rel = {"minimum": "greater than or equal to", "maximum": "less than or equal to"}.get(kw, "greater than")
        if kw == "minimum" and schema.get("exclusiveMinimum"):  # draft 4 reports exclusive bounds as "minimum"
            rel = "greater than"
        bound = schema["maximum"] if kw == "maximum" else schema["minimum"]
        return FieldError(path, f"{head}: should be {rel} {bound}; {_range_fix(schema)} ({doc})")
    if kw == "enum":
        allowed = ", ".join(f'"{v}"' for v in schema["enum"])
        return FieldError(path, f"{head}: Unsupported value: supported values: {allowed}")
    if (kw == "anyOf" and schema.get("x-kubernetes-int-or-string")) or (
        kw == "pattern" and "x-kubernetes-int-or-string" in schema
    ):
        return FieldError(path, f"{head}: must be a Kubernetes quantity such as 6Gi, 512Mi or 4 ({doc})")
    if kw == "pattern":
        return FieldError(path, f"{head}: should match '{schema['pattern']}' ({doc})")
    if kw in ("maxLength", "maxItems"):
        return FieldError(
            path, f"{head}: must have at most {err.validator_value} {'characters' if kw == 'maxLength' else 'items'}"
        )
    if kw == "format":
        return FieldError(path, f"{head}: must be an RFC 3339 {schema['format']} such as 2026-01-31T12:00:00Z")
    return FieldError(path, f"{head}: {err.message}")


_FORMAT_VERB = re.compile(r"%(.)")


def _cel_format(template: str, args: list[Any]) -> str:
    """``'…'.format([…])`` of Kubernetes' CEL strings library, for the verbs our messages use (%s, %d, %%).

    The API server estimates ``'a' + string(x)`` as unbounded in cost and refuses such a messageExpression in a
    CRD; ``format`` is what it accepts. The CEL library used here lacks it, hence this small, strict version."""
    values = iter(args)

    def verb(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter == "%":
            return "%"
        value = next(values)
        if letter == "d" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if letter == "s":
            return value if isinstance(value, str) else str(value)
        raise ValueError(f"format verb %{letter} does not take {value!r}")

    text = _FORMAT_VERB.sub(verb, template)
    if next(values, None) is not None:
        raise ValueError(f"format: more arguments than verbs in {template!r}")
    return text


_ABSENT: Any = object()  # no old value at this path: a create, or a field the update adds


def _rule_errors(schema: dict[str, Any], obj: Any, path: list[Any], old: Any = _ABSENT) -> Iterator[FieldError]:
    """Evaluate CEL rules bottom-up: children first, as the API server reports them.

    ``old`` is the value at the same path in the stored object on an update. Transition rules (those that read
    ``oldSelf``) run only where it exists, as in the API server; list items are not correlated (our schemas declare
    no map-type lists), so rules inside lists see no ``oldSelf``."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, child in schema["properties"].items():
            if key in obj:
                child_old = old[key] if isinstance(old, dict) and key in old else _ABSENT
                yield from _rule_errors(child, obj[key], [*path, key], child_old)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from _rule_errors(schema["items"], item, [*path, i])
    for rule in schema.get("x-kubernetes-validations", ()):
        transition = "oldSelf" in rule["rule"]
        if transition and old is _ABSENT:
            continue
        context = cel.Context()
        context.add_variable("self", obj)
        if transition:
            context.add_variable("oldSelf", old)
        context.add_function("format", _cel_format)
        try:
            ok = cel.evaluate(rule["rule"], context)
        except Exception as exc:  # a rule that cannot be evaluated fails, as in the API server
            ok, detail = False, f" (rule could not be evaluated: {exc})"
        else:
            detail = ""
        if ok is True:
            continue
        text = rule["message"]
        if "messageExpression" in rule:
            try:
                text = str(cel.evaluate(rule["messageExpression"], context))
            except Exception:  # the static message is the documented fallback
                text = rule["message"]
        field_path = rule.get("fieldPath", "").lstrip(".")
        where = _path(path)
        if field_path:
            where = f"{where}.{field_path}" if where else field_path
        elif not where and "self.metadata.name" in rule["rule"]:
            # Root rules may only read metadata.name, and cannot declare a fieldPath into metadata.
            where, field_path = "metadata.name", "metadata.name"
        value: Any = obj
        for part in field_path.split(".") if field_path else ():
            value = value.get(part) if isinstance(value, dict) else None
        label = "Required value" if rule.get("reason") == "FieldValueRequired" else f"Invalid value: {_show(value)}"
        yield FieldError(where, f"{where}: {label}: {text}{detail} [rule: {rule['rule']}]")


# Schema errors after which the API server evaluates no CEL rule (apiextensions-apiserver's hasBlockingErr: types,
# unsupported enum values, missing required fields, too long, too many); after the others (ranges, patterns) it
# still runs them and reports both.
_BLOCKING = frozenset({"type", "format", "enum", "required", "maxLength", "maxItems", "maxProperties", "anyOf"})
_BLOCKING |= {"additionalProperties"}  # an unknown field: the server refuses to decode the object at all


_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft4Validator]] = {}


def _validator(schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    """The strict validator of ``schema``, built once per schema object (the loader passes one schema per kind; the
    operator parses every job it sees). Keyed by identity and holding the schema, so an id is never reused."""
    hit = _VALIDATORS.get(id(schema))
    if hit is None or hit[0] is not schema:
        if len(_VALIDATORS) >= 64:
            _VALIDATORS.clear()
        hit = (schema, jsonschema.Draft4Validator(strict_schema(schema), format_checker=_FORMATS))
        _VALIDATORS[id(schema)] = hit
    return hit[1]


def check_object(schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
    """All violations of ``obj`` (defaulted in place when the schema passes) against a CRD version's schema, which
    must not change afterwards (its validator is kept); ``old``: the stored object when ``obj`` updates it
    (transition rules with ``oldSelf`` then apply)."""
    validator = _validator(schema)
    errors = sorted(validator.iter_errors(obj), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    found = [_schema_error(e) for e in errors]
    if any(e.validator in _BLOCKING for e in errors):
        return list(dict.fromkeys(found))
    apply_defaults(schema, obj)
    if old is not None:
        old = apply_defaults(schema, copy.deepcopy(old))
    return list(dict.fromkeys([*found, *_rule_errors(schema, obj, [], _ABSENT if old is None else old)]))
