"""Load manifests from YAML and validate them exactly as admission would (plus the pipeline shape's rules)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from pipefill.spec._schema import from_obj
from pipefill.spec.crd import GROUP, KINDS, VERSION, object_schema
from pipefill.spec.filljob import FillJob
from pipefill.spec.shape import shape_errors
from pipefill.spec.training import PipelineTrainingJob
from pipefill.spec.validation import FieldError, check_object

__all__ = ["API_VERSION", "Manifest", "SpecError", "load_file", "load_training_job", "parse", "parse_yaml", "validate"]

API_VERSION = f"{GROUP}/{VERSION}"
Manifest = PipelineTrainingJob | FillJob


class SpecError(ValueError):
    """A manifest the API server would reject; ``errors`` lists every violation."""

    def __init__(self, *, kind: str, name: str, source: str, errors: list[FieldError]) -> None:
        self.kind, self.name, self.source, self.errors = kind, name, source, errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f'{kind} "{name}" is invalid ({source}):\n{lines}')


SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader on libyaml's parser where PyYAML has it (its wheels do): the pure-Python one took 20 ms a
FillJob manifest, 2 s of each fill executor's first poll of a 100-job queue, beside the training."""


class _StrictLoader(SAFE_LOADER):  # type: ignore[misc,valid-type]
    """:data:`SAFE_LOADER` that refuses duplicate keys, as the API server's strict decoding does."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1}): remove one of them", mark
            )
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_yaml(text: str, *, source: str = "<input>") -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``text``; a clear error for anything that is not a mapping."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"{source}: not valid YAML{where}: {problem}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ValueError(
                f"{source}: document {i + 1} is a {type(doc).__name__}, expected a manifest (a mapping with apiVersion, kind, metadata, spec)"
            )
    return docs


@functools.cache
def _schema(kind: str) -> dict[str, Any]:
    """The kind's schema, built once (read only: check_object keeps a validator of it)."""
    return object_schema(kind)


def validate(
    obj: dict[str, Any], *, source: str = "<input>", old: dict[str, Any] | None = None
) -> tuple[str, str, list[FieldError]]:
    """(kind, name, violations) of one manifest; ``obj`` gets the schema's defaults when it is valid. ``old``: the
    stored object when ``obj`` is an update of it (then the update-only rules with ``oldSelf`` apply too)."""
    kind = obj.get("kind")
    name = str((obj.get("metadata") or {}).get("name", "")) if isinstance(obj.get("metadata"), dict) else ""
    if obj.get("apiVersion") != API_VERSION:
        err = FieldError(
            "apiVersion",
            f"apiVersion: Invalid value: {obj.get('apiVersion')!r}: this release serves {API_VERSION}; set apiVersion: {API_VERSION}",
        )
        return str(kind), name, [err]
    if kind not in KINDS:
        err = FieldError(
            "kind", f"kind: Unsupported value: {kind!r}: supported values: " + ", ".join(f'"{k}"' for k in KINDS)
        )
        return str(kind), name, [err]
    if not name:
        return (
            kind,
            name,
            [
                FieldError(
                    "metadata.name",
                    "metadata.name: Required value: name or generateName is required; add metadata.name",
                )
            ],
        )
    obj.pop("status", None)  # the status subresource ignores status on create
    errors = check_object(_schema(kind), obj, old)
    if not errors and kind == "PipelineTrainingJob":  # what the schema cannot say: the schedule's own rules
        errors = shape_errors(from_obj(PipelineTrainingJob, obj))
    return kind, name, errors


def parse(obj: dict[str, Any], *, source: str = "<input>", old: dict[str, Any] | None = None) -> Manifest:
    """A typed manifest, or :class:`SpecError` naming every violation; ``old`` as in :func:`validate`."""
    obj = copy.deepcopy(obj)
    kind, name, errors = validate(obj, source=source, old=old)
    if errors:
        raise SpecError(kind=kind, name=name, source=source, errors=errors)
    model: Manifest = from_obj(KINDS[kind].model, obj)
    return model


def load_file(path: str | Path) -> list[Manifest]:
    """Every manifest in a YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; pass the path of a manifest (YAML)") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a manifest from it: {exc}") from None
    return [parse(doc, source=str(path)) for doc in parse_yaml(text, source=str(path))]


def load_training_job(path: str | Path) -> PipelineTrainingJob:
    """The single PipelineTrainingJob of a file."""
    jobs = [m for m in load_file(path) if isinstance(m, PipelineTrainingJob)]
    if len(jobs) != 1:
        raise ValueError(f"{path}: expected exactly one PipelineTrainingJob, found {len(jobs)}")
    return jobs[0]
