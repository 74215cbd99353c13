"""The two custom resources, ``PipelineTrainingJob`` and ``FillJob`` (pipefill.io/v1alpha1), as typed models.

The models are the one source of truth: the CRDs in ``crds/`` are generated from them, and :func:`parse` validates a
manifest with the same OpenAPI schema and CEL rules the API server runs, so every entry point rejects bad input with
the message a cluster would give.
"""

from pipefill.spec._schema import to_obj
from pipefill.spec.crd import GROUP, KINDS, VERSION, crd, object_schema
from pipefill.spec.filljob import BUILTIN_WORKLOADS, FillJob, FillJobPhase, FillJobSpec, FillJobStatus, WorkKind
from pipefill.spec.loader import API_VERSION, Manifest, SpecError, load_file, load_training_job, parse, parse_yaml
from pipefill.spec.quantity import parse_bytes, parse_quantity
from pipefill.spec.training import (
    MODEL_PRESETS,
    DataSource,
    GangMode,
    JobPhase,
    PipelineTrainingJob,
    PipelineTrainingJobSpec,
    PipelineTrainingJobStatus,
    PodTemplate,
    Schedule,
    SharingMode,
)
from pipefill.spec.validation import FieldError

__all__ = [
    "API_VERSION",
    "BUILTIN_WORKLOADS",
    "GROUP",
    "KINDS",
    "MODEL_PRESETS",
    "VERSION",
    "DataSource",
    "FieldError",
    "FillJob",
    "FillJobPhase",
    "FillJobSpec",
    "FillJobStatus",
    "GangMode",
    "JobPhase",
    "Manifest",
    "PipelineTrainingJob",
    "PipelineTrainingJobSpec",
    "PipelineTrainingJobStatus",
    "PodTemplate",
    "Schedule",
    "SharingMode",
    "SpecError",
    "WorkKind",
    "crd",
    "load_file",
    "load_training_job",
    "object_schema",
    "parse",
    "parse_bytes",
    "parse_quantity",
    "parse_yaml",
    "to_obj",
]
