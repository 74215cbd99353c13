"""What ``pipefill local -f`` accepts: the files ``kubectl apply -f`` would take for the same job.

One PipelineTrainingJob, the FillJobs it may host, and the ConfigMaps it reads: for ``schedule: custom``, the
ConfigMap named by ``spec.pipeline.customSchedule`` whose key holds the schedule's CSV; for a FillJob whose
``spec.workload.code.configMap`` names one, the ConfigMap holding its module files (handed to the fill executor's
files source, as the executor reads it through the API on a cluster). The operator copies that CSV
from the cluster's ConfigMap into the job's spec ConfigMap (beside ``job.yaml``); locally it comes from the manifest
given with ``-f``, through the same core function (:func:`pipefill.children.schedule_csv_of`), and is written beside
the local ``job.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipefill.children import schedule_csv_of
from pipefill.spec import FillJob, PipelineTrainingJob, Schedule, parse, parse_yaml
from pipefill.spec.shape import ShapeError, from_spec

__all__ = ["LocalManifests", "load_manifests"]

_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # what the API server allows as a ConfigMap data key


@dataclass
class LocalManifests:
    """The job, the fill jobs it hosts, its custom schedule's CSV (None unless ``schedule: custom``), the ConfigMaps
    the fill jobs' code is in, warnings."""

    job: PipelineTrainingJob
    fills: list[FillJob] = field(default_factory=list)
    schedule_csv: str | None = None
    config_maps: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _config_map(doc: dict[str, Any], source: str) -> tuple[str, str | None, dict[str, Any]]:
    """(name, namespace, the manifest) of a ConfigMap, checked as the API server would check what is used here."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{source}: ConfigMap metadata.name: Required value: a ConfigMap needs a name; add metadata.name "
            "(the name spec.pipeline.customSchedule.name refers to)"
        )
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{source}: ConfigMap {name!r} data: Invalid value: a {type(data).__name__}: data maps keys to strings; "
            "write it as key: value lines"
        )
    for key, value in data.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key in (".", ".."):
            raise ValueError(
                f"{source}: ConfigMap {name!r} data: Invalid value: {key!r}: a key must consist of alphanumeric "
                "characters, '-', '_' or '.'; rename it (e.g. schedule.csv)"
            )
        if not isinstance(value, str):
            raise ValueError(
                f"{source}: ConfigMap {name!r} data.{key}: Invalid value: a {type(value).__name__}: values are "
                "strings; quote it, or use a block scalar (|) for a CSV"
            )
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return name, namespace if isinstance(namespace, str) else None, doc


def _is_config_map(doc: dict[str, Any]) -> bool:
    return doc.get("apiVersion") == "v1" and doc.get("kind") == "ConfigMap"


def load_manifests(paths: list[str]) -> LocalManifests:
    """Everything ``paths`` hold, validated; raises SpecError/ValueError naming the field, value, rule and fix."""
    docs: list[tuple[dict[str, Any], str]] = []
    for path in paths:
        docs.extend((doc, path) for doc in parse_yaml(_read(path), source=path))
    config_maps: dict[str, tuple[str | None, dict[str, Any], str]] = {}
    manifests = []
    for doc, source in docs:
        if _is_config_map(doc):
            name, namespace, obj = _config_map(doc, source)
            if name in config_maps:
                raise ValueError(
                    f"{source}: ConfigMap {name!r} is given twice (also in {config_maps[name][2]}); pass it once"
                )
            config_maps[name] = (namespace, obj, source)
        else:
            manifests.append(parse(doc, source=source))
    jobs = [m for m in manifests if isinstance(m, PipelineTrainingJob)]
    if len(jobs) != 1:
        names = ", ".join(j.name for j in jobs) or "none"
        raise ValueError(
            f"pipefill local runs exactly one PipelineTrainingJob per invocation; the files hold {len(jobs)} ({names})"
        )
    job = jobs[0]
    out = LocalManifests(job=job, schedule_csv=_schedule_csv(job, config_maps))
    labels = {str(k): str(v) for k, v in (job.metadata.get("labels") or {}).items()}
    for fill in (m for m in manifests if isinstance(m, FillJob)):
        if fill.spec.host_selector.matches(labels):
            out.fills.append(fill)
        else:
            out.warnings.append(
                f"FillJob {fill.name!r} does not select PipelineTrainingJob {job.name!r} (spec.hostSelector vs its labels); it stays queued"
            )
    if not job.spec.fill.enabled and out.fills:
        out.warnings.append(
            f"spec.fill.enabled is false on {job.name!r}: no fill executor runs, the FillJobs stay queued"
        )
    ref = job.spec.pipeline.custom_schedule
    used = {ref.name} if ref is not None and job.spec.pipeline.schedule == Schedule.CUSTOM else set()
    code = {f.spec.workload.code.config_map for f in out.fills if f.spec.workload.code is not None}
    model_code = job.spec.model.python.code if job.spec.model.python is not None else None
    if model_code is not None and model_code.config_map:
        if model_code.config_map not in config_maps:
            raise ValueError(
                f"spec.model.python.code.configMap {model_code.config_map!r}: no such ConfigMap among the files; "
                "pass its manifest with -f"
            )
        code.add(model_code.config_map)
    for name, (_, obj, source) in config_maps.items():
        if name in code:
            out.config_maps.append(obj)
        elif name not in used:
            out.warnings.append(
                f"ConfigMap {name!r} ({source}) is not used by {job.name!r} or its FillJobs; it is ignored"
            )
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; pass the path of a manifest (YAML)") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a manifest from it: {exc}") from None


def _schedule_csv(
    job: PipelineTrainingJob, config_maps: dict[str, tuple[str | None, dict[str, Any], str]]
) -> str | None:
    """The custom schedule's CSV from the ConfigMap given with -f, as the operator reads it from the cluster."""
    ref = job.spec.pipeline.custom_schedule
    if job.spec.pipeline.schedule != Schedule.CUSTOM or ref is None:
        return None
    found = config_maps.get(ref.name)
    job_namespace = job.metadata.get("namespace")
    if found is not None and found[0] and job_namespace and found[0] != job_namespace:
        raise ValueError(
            f"spec.pipeline.customSchedule.name: Invalid value: {ref.name!r}: the ConfigMap must be in the job's "
            f"namespace {job_namespace!r}, and {found[2]} puts it in {found[0]!r}; make the two metadata.namespace agree"
        )
    try:
        csv = schedule_csv_of(job, None if found is None else found[1])
    except LookupError as exc:
        given = ", ".join(sorted(config_maps)) or "none"
        fix = (
            f"pass its manifest with -f (ConfigMaps given: {given}), the same file kubectl apply -f takes"
            if found is None
            else f"add the key to its data (in {found[2]}) or set spec.pipeline.customSchedule.key to one it has"
        )
        raise ValueError(
            f"spec.pipeline.customSchedule: {exc}: schedule custom reads its CSV from there; {fix}"
        ) from None
    try:  # the schedule's own rules, as the operator checks them before creating pods (InvalidSpec there)
        from_spec(job, schedule_csv=csv)
    except ShapeError as exc:
        problems = "\n".join(f"  - {e.text}" for e in exc.errors)
        raise ValueError(
            f"PipelineTrainingJob {job.name!r}: its custom schedule (ConfigMap {ref.name!r} key {ref.key!r}, "
            f"{found[2] if found else '?'}) cannot run:\n{problems}"
        ) from None
    return csv
