"""The malformed manifests of tests/malformed_cases.py through ``pipefill local`` (#22, "bad input, tried in bulk"):
each is refused before anything starts, with exit code 2 and every message the API server gives for it from the
CRD's schema and CEL rules — the same field, value, rule and fix locally as on a cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from malformed_cases import CASES, PTJ, crd_schema

from pipefill.cli import main
from pipefill.spec.validation import check_object


@pytest.mark.parametrize(("manifest", "field"), [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_pipefill_local_refuses_it_with_the_api_servers_message(
    manifest: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(manifest))
    files = ["-f", str(case)]
    if manifest["kind"] == "FillJob":  # beside a valid training job: the FillJob is what is refused
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(PTJ))
        files = ["-f", str(tmp_path / "job.yaml"), *files]
    out = tmp_path / "out"
    assert main(["local", *files, "--out", str(out), "--plain"]) == 2
    stderr = capsys.readouterr().err
    on_a_cluster = check_object(crd_schema(manifest["kind"]), copy.deepcopy(manifest))
    assert on_a_cluster and all(e.text in stderr for e in on_a_cluster), (stderr, on_a_cluster)
    assert field in stderr and f'{manifest["kind"]} "{manifest["metadata"]["name"]}" is invalid ({case})' in stderr
    assert not out.exists()  # nothing started, nothing written
