"""User code in the real executor (real processes, the real channel, files on disk): jobs whose code does not import,
ends the process at import or breaks the SDK's contract end Failed with a message naming the job, the field and the
fix, while a job whose code came from a ConfigMap keeps running in the same executor."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fill_helpers import start_producer
from sharing import own_core
from usercode_helpers import (
    BAD_STEP_PY,
    EXITS_PY,
    RAISES_PY,
    install_package,
    start_fill,
    user_job,
    write_code,
    write_config_map,
)
from waiting import wait_for

from pipefill import env

pytestmark = pytest.mark.slow


def _status(jobs: Path, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((jobs / f"{name}.status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen[str], timeout_s: float = 90) -> None:
    def check() -> bool:
        if ready():
            return True
        if proc.poll() is not None:
            pytest.fail(f"the executor exited ({proc.returncode}) before {what}: {proc.communicate()[1][-3000:]}")
        return False

    try:
        wait_for(check, what, timeout_s, interval_s=0.1)
    except AssertionError as exc:
        proc.kill()
        pytest.fail(f"{exc}: {proc.communicate()[1][-3000:]}")


def test_bad_user_code_fails_its_job_alone(tmp_path: Path) -> None:
    jobs, storage, cpu = tmp_path / "jobs", tmp_path / "storage", own_core()
    jobs.mkdir()
    code = write_code(tmp_path / "src", factor=2.0)
    write_config_map(jobs, "good-code", {p.name: p.read_text() for p in code.glob("*.py")})
    write_code(storage / "code", extra={"raises.py": RAISES_PY, "exits.py": EXITS_PY})
    site = install_package(
        tmp_path / "site",
        dist="acme-bad",
        entry_points={"no-batch": "acme_bad:NoBatch"},
        modules={"acme_bad.py": BAD_STEP_PY},
    )
    good = {"importPath": "embed:Scaled", "code": {"configMap": "good-code"}, "parameters": {"delayUs": 50}}
    user_job(jobs, "good", total=10**7, **good)
    fill = start_fill(tmp_path, jobs, cpu=cpu, python_path=site, **{env.FILL_STORAGE_DIR: str(storage)})
    # 150 ms bubbles take the commits (the first one sets the commit estimate, and a commit must fit a bubble)
    producer = start_producer(tmp_path / "channel", bubbles_ms="20,150", count=100_000, compute_ms=5.0, cpu=cpu)
    try:
        _wait("the good job commits", lambda: _status(jobs, "good").get("samplesDone", 0) > 0, fill)
        user_job(jobs, "broken", importPath="raises:C", code={"path": "code"})
        user_job(jobs, "exits", importPath="exits:C", code={"path": "code"})
        user_job(jobs, "nocontract", entryPoint="no-batch")
        bad = ("broken", "exits", "nocontract")
        _wait("the bad jobs fail", lambda: all(_status(jobs, n).get("phase") == "Failed" for n in bad), fill)
        done_then = _status(jobs, "good")["samplesDone"]
        _wait("the good job goes on", lambda: _status(jobs, "good")["samplesDone"] > done_then, fill)
        messages = {n: _status(jobs, n)["message"] for n in bad}
        assert _status(jobs, "good")["phase"] == "Running"
    finally:
        producer.kill()
        producer.communicate(timeout=30)
    _, err = fill.communicate(timeout=60)
    assert fill.returncode == 0, err[-3000:]
    assert (
        "FillJob broken: spec.workload.importPath: module 'raises' from spec.workload.code.path 'code' raised"
        in (messages["broken"])
    )
    assert "ZeroDivisionError: division by zero" in messages["broken"] and "fix the code" in messages["broken"]
    assert "FillJob exits:" in messages["exits"] and "SystemExit: 3" in messages["exits"]
    assert (
        "FillJob nocontract: spec.workload.entryPoint: 'no-batch' (acme_bad:NoBatch): step(self) -> int does not"
        in (messages["nocontract"])
    )
