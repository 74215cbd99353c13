"""Loading a FillJob's workload class at job start, wherever its code comes from (docs/fill.md, "User code").

* ``builtin``: one of :data:`pipefill_fill.workload.BUILTINS`.
* ``entryPoint``: a workload a Python package installed in the fill image registers in the entry point group
  ``pipefill.workloads`` (a fill image built ``FROM`` ours: ``pip install`` the package, nothing else to configure).
* ``importPath`` alone: a module importable in the fill image.
* ``importPath`` with ``code.path`` (a directory on the training job's fill storage) or ``code.configMap`` (a ConfigMap
  whose keys are the module files): the module is loaded from there when the job starts.

Code from the storage or a ConfigMap is imported as a private package named after a digest of its files
(``_pipefill_code_<digest>``, :mod:`pipefill.usercode`, shared with the trainer), never on ``sys.path``: two jobs
whose modules share a name (``embed.py``) but not their contents each get their own, and a job's code cannot shadow a
module of the executor or of another job. Its modules therefore import each other relatively
(``from . import helpers``).

Every failure (a module that does not import, raises while importing, or a class that breaks the SDK's contract)
becomes one :class:`ValueError` that names the FillJob, the field, the value and the fix; the executor fails that job
alone (:meth:`pipefill_fill.jobs.Jobs.fail`) and goes on with the others.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from pipefill import env
from pipefill.spec.filljob import ENTRY_POINT_GROUP
from pipefill.usercode import PACKAGE_PREFIX, directory_files, import_attr, private_package
from pipefill_fill.configmaps import read_config_map
from pipefill_fill.work import TaskSpec
from pipefill_fill.workload import check_workload_class, load_workload_class, split_import_path

__all__ = ["ENTRY_POINT_GROUP", "PACKAGE_PREFIX", "fill_storage_dir", "load_job_workload"]


def fill_storage_dir() -> Path:
    """Where ``code.path`` is resolved: the training job's fill storage (``PIPEFILL_FILL_STORAGE_DIR``, its mount in
    the fill sidecar); unset (``pipefill local``): the working directory, where relative input and output paths go."""
    return Path(os.environ.get(env.FILL_STORAGE_DIR) or Path.cwd())


def load_job_workload(spec: TaskSpec) -> type:
    """The workload class of ``spec``, its contract checked; a ValueError naming the job, the field and the fix."""
    try:
        if spec.entry_point is not None:
            return _from_entry_point(spec.entry_point, kind=spec.kind)
        if spec.import_path is not None and (spec.code_path is not None or spec.code_config_map is not None):
            return _from_code(spec)
        return load_workload_class(builtin=spec.builtin, import_path=spec.import_path, kind=spec.kind)
    except ValueError as exc:
        raise ValueError(f"FillJob {spec.name}: {exc}") from None


def _from_entry_point(name: str, *, kind: str) -> type:
    field = "spec.workload.entryPoint"
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        raise ValueError(
            f"{field}: {name!r}: no installed package registers it in the entry point group {ENTRY_POINT_GROUP!r} "
            f'(registered: {known or "none"}); install the package in the fill image (docs/fill.md, "User code") '
            "or fix the name"
        )
    targets = sorted({ep.value for ep in found})
    if len(targets) > 1:
        raise ValueError(
            f"{field}: {name!r} is registered by several installed packages ({', '.join(targets)}); "
            "uninstall all but one from the fill image"
        )
    try:
        cls = found[0].load()
    except BaseException as exc:  # SystemExit too: a package must not end the executor
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ValueError(
            f"{field}: {name!r} → {targets[0]} does not load ({type(exc).__name__}: {exc}); fix the package or its "
            "entry point"
        ) from None
    return check_workload_class(cls, what=f"{name!r} ({targets[0]})", field=field, kind=kind)


def _from_code(spec: TaskSpec) -> type:
    assert spec.import_path is not None  # for mypy: the caller checked
    if spec.code_path is not None:
        field, value = "spec.workload.code.path", spec.code_path
        files = _storage_files(spec.code_path)
    else:
        assert spec.code_config_map is not None  # for mypy: one of the two is set
        field, value = "spec.workload.code.configMap", spec.code_config_map
        files = _config_map_files(spec.code_config_map, namespace=spec.namespace)
    module_name, attr = split_import_path(spec.import_path)
    package = private_package(files, doc="FillJob code (pipefill_fill.usercode)")
    where = f"{field} {value!r}"
    cls = import_attr(
        package, files, module_name=module_name, attr=attr, field="spec.workload.importPath", where=where, noun="class"
    )
    return check_workload_class(
        cls, what=f"{spec.import_path!r} from {where}", field="spec.workload.importPath", kind=spec.kind
    )


def _storage_files(rel: str) -> dict[Path, bytes]:
    """The ``.py`` files under ``rel`` on the fill storage (relative path → contents)."""
    storage = fill_storage_dir()
    return directory_files(
        storage / rel,
        field=f"spec.workload.code.path: {rel!r}",
        base=storage,
        base_name="fill storage",
        fix='copy the code there (docs/fill.md, "User code")',
    )


def _config_map_files(name: str, *, namespace: str | None) -> dict[Path, bytes]:
    data = read_config_map(name, namespace=namespace)
    bad = [k for k in data if not k.endswith(".py") or "/" in k]
    if bad:
        raise ValueError(
            f"spec.workload.code.configMap: {name!r} has keys that are not module files ({', '.join(sorted(bad))}); "
            "name each key after its module (embed.py) and keep other data elsewhere"
        )
    return {Path(k): v.encode() for k, v in data.items()}
