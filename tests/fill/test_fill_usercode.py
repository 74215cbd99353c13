"""User code (docs/fill.md, "User code"): workloads from an installed package's entry points, from a directory on the
fill storage and from a ConfigMap, loaded at job start as private packages with the SDK's contract checked; every
failure an error that names the job, the field and the fix. Files on disk, real imports, real dist-info metadata."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from usercode_helpers import BAD_STEP_PY, EXITS_PY, RAISES_PY, install_package, user_job, write_code, write_config_map

from pipefill import env
from pipefill.spec import FillJob, load_file
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask
from pipefill_fill.usercode import PACKAGE_PREFIX, load_job_workload
from pipefill_fill.work import TaskSpec


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fill storage's mount (PIPEFILL_FILL_STORAGE_DIR) and a files work source beside it."""
    root = tmp_path / "storage"
    root.mkdir()
    monkeypatch.setenv(env.FILL_STORAGE_DIR, str(root))
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{tmp_path / 'jobs'}")
    (tmp_path / "jobs").mkdir()
    return root


def _spec(manifest: Path) -> TaskSpec:
    (job,) = load_file(manifest)
    assert isinstance(job, FillJob)
    return TaskSpec.from_spec(job)


def _run(spec: TaskSpec) -> np.ndarray:
    task = FillTask(spec)
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    while not task.done():
        task.step(7)
        task.commit()
    task.finish()
    return read_outputs(spec.output_dir)["value"]


def test_code_on_the_fill_storage_is_loaded_privately_per_content(storage: Path, tmp_path: Path) -> None:
    write_code(storage / "code" / "v1", factor=2.0)
    write_code(storage / "code" / "v2", factor=3.0)  # same module names, other contents
    path_before = list(sys.path)
    one = _spec(user_job(tmp_path, "one", importPath="embed:Scaled", code={"path": "code/v1"}))
    two = _spec(user_job(tmp_path, "two", importPath="embed:Scaled", code={"path": "code/v2"}))
    out_one, out_two = _run(one), _run(two)
    assert np.array_equal(out_one[:, 0], np.arange(40) * 2.0) and np.array_equal(out_two[:, 0], np.arange(40) * 3.0)
    cls_one, cls_two = load_job_workload(one), load_job_workload(two)
    assert cls_one is not cls_two and cls_one.__module__.startswith(PACKAGE_PREFIX)
    assert load_job_workload(one) is cls_one  # the same content is the same module
    assert sys.path == path_before and "embed" not in sys.modules and "helpers" not in sys.modules


def test_code_from_a_config_map(storage: Path, tmp_path: Path) -> None:
    code = write_code(tmp_path / "src", factor=5.0)
    write_config_map(tmp_path / "jobs", "embed-code", {p.name: p.read_text() for p in code.glob("*.py")})
    spec = _spec(user_job(tmp_path, "cm", importPath="embed:Scaled", code={"configMap": "embed-code"}))
    assert np.array_equal(_run(spec)[:, 0], np.arange(40) * 5.0)


def test_a_package_installed_in_the_fill_image_by_entry_point(
    storage: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = install_package(
        tmp_path / "site",
        dist="acme-fill",
        entry_points={"acme-scaled": "acme_fill.embed:Scaled", "acme-exits": "acme_fill.exits:C"},
        modules={
            "acme_fill/__init__.py": "",
            "acme_fill/embed.py": (write_code(tmp_path / "src") / "embed.py").read_text(),
            "acme_fill/helpers.py": "FACTOR = 4.0\n",
            "acme_fill/exits.py": EXITS_PY,
        },
    )
    monkeypatch.syspath_prepend(str(site))
    spec = _spec(user_job(tmp_path, "ep", entryPoint="acme-scaled"))
    assert np.array_equal(_run(spec)[:, 0], np.arange(40) * 4.0)
    assert load_job_workload(spec).__module__ == "acme_fill.embed"
    broken = _spec(user_job(tmp_path, "ep-exits", entryPoint="acme-exits"))
    with pytest.raises(
        ValueError,
        match=r"FillJob ep-exits: spec\.workload\.entryPoint: 'acme-exits' → acme_fill\.exits:C "
        r"does not load \(SystemExit: 3\); fix the package or its entry point",
    ):
        load_job_workload(broken)


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (
            {"importPath": "embed:Scaled", "code": {"path": "code/missing"}},
            r"FillJob bad: spec\.workload\.code\.path: 'code/missing': .* is not a directory on the fill storage .*; "
            "copy the code there",
        ),
        (
            {"importPath": "nothere:Scaled", "code": {"path": "code/ok"}},
            r"FillJob bad: spec\.workload\.importPath: module 'nothere' is not in spec\.workload\.code\.path "
            r"'code/ok' \(it holds badstep\.py, embed\.py, .*\); add nothere\.py there or fix importPath",
        ),
        (
            {"importPath": "embed:Missing", "code": {"path": "code/ok"}},
            r"FillJob bad: spec\.workload\.importPath: module 'embed' from .* has no class 'Missing'",
        ),
        (
            {"importPath": "raises:C", "code": {"path": "code/ok"}},
            r"FillJob bad: spec\.workload\.importPath: module 'raises' from spec\.workload\.code\.path 'code/ok' raised "
            r"while importing \(ZeroDivisionError: division by zero\); fix the code",
        ),
        (
            {"importPath": "exits:C", "code": {"path": "code/ok"}},
            r"FillJob bad: .* raised while importing \(SystemExit: 3\)",
        ),
        (
            {"importPath": "badstep:NoBatch", "code": {"path": "code/ok"}},
            r"FillJob bad: spec\.workload\.importPath: 'badstep:NoBatch' from .*: step\(self\) -> int does not take the "
            r"arguments the executor passes \(step\(self, int\)\); see the workload SDK",
        ),
        (
            {"importPath": "embed:Scaled", "code": {"configMap": "absent"}},
            r"FillJob bad: spec\.workload\.code\.configMap: ConfigMap 'absent' was not given .*; pass its manifest to "
            "pipefill local with -f",
        ),
        (
            {"importPath": "embed:Scaled", "code": {"configMap": "notcode"}},
            r"FillJob bad: spec\.workload\.code\.configMap: 'notcode' has keys that are not module files \(data\.csv\)",
        ),
        (
            {"entryPoint": "no-such-workload"},
            r"FillJob bad: spec\.workload\.entryPoint: 'no-such-workload': no installed package registers it in the "
            r"entry point group 'pipefill\.workloads' .*; install the package in the fill image",
        ),
    ],
)
def test_code_that_does_not_load_is_explained(
    storage: Path, tmp_path: Path, workload: dict[str, object], message: str
) -> None:
    write_code(storage / "code" / "ok", extra={"raises.py": RAISES_PY, "exits.py": EXITS_PY, "badstep.py": BAD_STEP_PY})
    write_config_map(tmp_path / "jobs", "notcode", {"embed.py": "", "data.csv": "1,2\n"})
    spec = _spec(user_job(tmp_path, "bad", **workload))
    with pytest.raises(ValueError, match=message):
        FillTask(spec)
    assert not [m for m in sys.modules if m.startswith(PACKAGE_PREFIX) and m.endswith((".raises", ".exits"))]


def test_storage_path_cannot_leave_the_storage(storage: Path, tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (storage / "link").symlink_to(tmp_path / "outside")
    spec = _spec(user_job(tmp_path, "escape", importPath="embed:Scaled", code={"path": "link"}))
    with pytest.raises(ValueError, match=r"spec\.workload\.code\.path: 'link' leads out of the fill storage"):
        load_job_workload(spec)
