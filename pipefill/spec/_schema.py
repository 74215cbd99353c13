"""Typed spec models as the one source of truth for the CRD schema.

A model is a dataclass whose fields are declared with :func:`field`. From the annotations and the field metadata we
derive (a) the OpenAPI v3 structural schema that goes into the CRD, with CEL rules (``x-kubernetes-validations``)
taken from the class attribute ``__rules__``, and (b) the objects themselves from validated, defaulted YAML
(:func:`from_obj`) and back (:func:`to_obj`). Nothing else describes the fields, so the CRD and the Python loader
cannot drift.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pipefill.spec.quantity import QUANTITY_PATTERN

__all__ = ["DERIVED", "FieldInfo", "Model", "Rule", "field", "from_obj", "json_name", "openapi", "to_obj"]

DERIVED = "_pipefill_derived"
"""set (True) on a model instance the user did not write (a placeholder, or a part derived from another):
:func:`to_obj` leaves it out, so a parsed object written back reads the same"""

_MISSING: Any = dataclasses.MISSING
_T = typing.TypeVar("_T")
# Bounds on every string, list and map unless a field sets its own. The API server estimates each CEL rule's cost
# from the largest value the schema allows and refuses a CRD whose rules could exceed the budget; unbounded strings
# and lists make every rule that touches them "unbounded". The bounds are generous for what the fields hold.
_MAX_STRING_LENGTH = 1024
_MAX_QUANTITY_LENGTH = 64
_MAX_ITEMS = 256
_MAX_PROPERTIES = 256


@dataclass(frozen=True)
class Rule:
    """One CEL validation rule, written into ``x-kubernetes-validations`` and evaluated by the Python loader."""

    rule: str
    message: str
    message_expression: str | None = None
    field_path: str | None = None  # e.g. ".globalBatch": where the API server reports the error
    reason: str = "FieldValueInvalid"

    def to_openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        # The API server accepts fieldPath only into declared properties, and root metadata declares none.
        if self.field_path and not self.field_path.startswith(".metadata"):
            out["fieldPath"] = self.field_path
        if self.reason != "FieldValueInvalid":
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class FieldInfo:
    """Schema facts of one field beyond its Python type."""

    doc: str
    name: str | None = None  # the camelCase name in YAML; derived from the Python name when None
    unit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    pattern: str | None = None
    max_length: int | None = None
    max_items: int | None = None
    fmt: str | None = None  # OpenAPI format, e.g. "date-time"
    quantity: bool = False  # a Kubernetes resource quantity: int or string like "6Gi"
    free_form: bool = False  # dict[str, Any] kept as is (x-kubernetes-preserve-unknown-fields)
    schema_optional: bool = False  # neither required nor defaulted by the schema: the Python default is a
    # placeholder, and the type's rules say when the field is required


class Model(Protocol):
    """What every spec model class provides (a dataclass with optional CEL rules)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    __rules__: ClassVar[tuple[Rule, ...]]


def field(*, doc: str, default: Any = _MISSING, default_factory: Any = _MISSING, **facts: Any) -> Any:
    """Declare a spec field. ``doc`` is its description in the CRD and docs: say the unit, default and why."""
    info = FieldInfo(doc=doc, **facts)
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"spec": info})
    return dataclasses.field(default=default, metadata={"spec": info})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def json_name(f: dataclasses.Field[Any]) -> str:
    info: FieldInfo = f.metadata["spec"]
    return info.name or _camel(f.name)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = tuple(a for a in typing.get_args(tp) if a is not type(None))
        optional = len(args) < len(typing.get_args(tp))
        return (args[0] if len(args) == 1 else typing.Union[args]), optional  # noqa: UP007
    return tp, False


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_schema(tp: Any, info: FieldInfo | None) -> dict[str, Any]:
    if info is not None and info.quantity:
        quantity = {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": _MAX_QUANTITY_LENGTH,
        }
        if typing.get_origin(_strip_optional(tp)[0]) is dict:  # a map of resource name -> quantity
            return {"type": "object", "additionalProperties": quantity, "maxProperties": _MAX_PROPERTIES}
        return quantity
    tp, _ = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if _is_model(tp):
        return openapi(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int64"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string", "maxLength": _MAX_STRING_LENGTH}
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(item, None), "maxItems": _MAX_ITEMS}
    if origin is dict:
        key, value = typing.get_args(tp)
        if key is not str:
            raise TypeError(f"map keys must be strings: {tp}")
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": _type_schema(value, None), "maxProperties": _MAX_PROPERTIES}
    raise TypeError(f"unsupported spec type {tp!r}")


def _field_schema(f: dataclasses.Field[Any], tp: Any) -> dict[str, Any]:
    info: FieldInfo = f.metadata["spec"]
    schema = _type_schema(tp, info)
    schema["description"] = info.doc
    for key, value in (
        ("minimum", info.minimum),
        ("maximum", info.maximum),
        ("pattern", info.pattern),
        ("maxLength", info.max_length),
        ("maxItems", info.max_items),
        ("format", info.fmt),
    ):
        if value is not None:
            schema[key] = value
    if info.exclusive_minimum:
        schema["exclusiveMinimum"] = True
    if info.schema_optional:  # its Python default is a placeholder: the schema neither requires nor defaults it
        return schema
    default = f.default
    if default is not _MISSING and default is not None:
        schema["default"] = default.value if isinstance(default, enum.Enum) else default
    elif f.default_factory is not _MISSING:
        factory: Any = f.default_factory
        made = to_obj(factory()) if _is_model(tp) else factory()
        schema["default"] = made
    return schema


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    """A model class's resolved field types, once per class (resolving them evaluates every annotation string: a
    third of the time of building a status from its dict, which the operator does at every reconcile)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def openapi(cls: type[Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model class, CEL rules included."""
    hints = _hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        properties[json_name(f)] = _field_schema(f, hints[f.name])
        if f.default is _MISSING and f.default_factory is _MISSING and not f.metadata["spec"].schema_optional:
            required.append(json_name(f))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    if required:
        schema["required"] = required
    rules: tuple[Rule, ...] = getattr(cls, "__rules__", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_openapi() for r in rules]
    return schema


def _build(tp: Any, value: Any) -> Any:
    tp, _ = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if value is None:
        return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return value  # int-or-string quantities stay as written
    if _is_model(tp):
        return from_obj(tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float and isinstance(value, int):
        return float(value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_build(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        return dict(value) if item is Any else {k: _build(item, v) for k, v in value.items()}
    return value


def from_obj(cls: type[_T], obj: dict[str, Any]) -> _T:
    """Build a model from a validated, defaulted mapping (camelCase keys)."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = json_name(f)
        if key in obj:
            kwargs[f.name] = _build(hints[f.name], obj[key])
    return cls(**kwargs)


def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_obj(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def to_obj(model: Any) -> dict[str, Any]:
    """The camelCase mapping of a model, leaving out unset optional fields."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(model):
        value = getattr(model, f.name)
        if value is not None and not getattr(value, DERIVED, False):
            out[json_name(f)] = _dump(value)
    return out
