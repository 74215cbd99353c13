"""What a Kubeflow Trainer user sees of a running job, in ``kubectl get ptj`` (#22, item 2): progress in percent of
the planned steps, the last loss and the estimated completion time are status fields with printer columns. (Their
values come from the ranks' metrics: tests/operator/test_operator_checks.py; the columns on a real API server:
tests/cluster/test_api_objects.py.)"""

from __future__ import annotations

from pipefill.spec.crd import KINDS, object_schema


def test_progress_loss_and_eta_are_printed_from_their_status_fields() -> None:
    columns = {path: (name, kind) for name, kind, path, _ in KINDS["PipelineTrainingJob"].columns}
    status = object_schema("PipelineTrainingJob")["properties"]["status"]["properties"]
    for path, name, kind in (
        (".status.progress", "Progress", "number"),
        (".status.loss", "Loss", "number"),
        (".status.estimatedCompletionTime", "ETA", "string"),  # a date column would print a future time as <invalid>
    ):
        assert columns.get(path) == (name, kind), (path, columns.get(path))
        assert path.removeprefix(".status.") in status, path
    assert status["estimatedCompletionTime"].get("format") == "date-time"
