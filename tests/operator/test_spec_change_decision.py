"""The decision on an edit of a running job's spec (pipefill.lifecycle.specchange, through ``decide``): a field the
running pods hold waits for the next gang and is named in SpecChangePending and its Event; a field the decision
reads on every look is taken at once and raises no notice; without the running spec the notice still comes."""

from __future__ import annotations

import datetime
from typing import Any

from operator_harness import job_manifest
from update_cases import merged

from pipefill.lifecycle import Decision, Observed, PodView, decide
from pipefill.lifecycle.conditions import find
from pipefill.lifecycle.specchange import AT_ONCE, changed_fields
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, parse, to_obj

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _job(**spec: Any) -> PipelineTrainingJob:
    job = parse(merged(job_manifest(), {"spec": spec}))
    assert isinstance(job, PipelineTrainingJob)
    return job


def _running_status() -> PipelineTrainingJobStatus:
    return PipelineTrainingJobStatus(phase=JobPhase.RUNNING, ranks_ready=2, start_time="2026-03-01T12:00:00Z")


def _pods(spec_generation: int) -> list[PodView]:
    return [
        PodView(
            name=f"train-{r}",
            rank=r,
            generation=0,
            phase="Running",
            deleting=False,
            trainer_running=True,
            spec_generation=spec_generation,
        )
        for r in range(2)
    ]


def _decide(job: PipelineTrainingJob, status: PipelineTrainingJobStatus, running: Any, gen: int) -> Decision:
    observed = Observed(pods=_pods(1), now=T0, running_spec=running)
    return decide(job, status, observed, job_generation=gen)


def _pending(d: Decision) -> tuple[str, str, str] | None:
    c = find(d.status.conditions, "SpecChangePending")
    return None if c is None else (c.status, c.reason, c.message)


def test_changed_fields_are_the_differing_leaves() -> None:
    old = to_obj(_job())["spec"]
    new = to_obj(_job(steps=500, optimizer={"learningRate": 0.001}))["spec"]
    assert changed_fields(old, new) == ["spec.optimizer.learningRate", "spec.steps"]
    assert changed_fields(old, old) == []


def test_a_field_the_pods_hold_waits_for_the_next_gang_and_is_named() -> None:
    built = to_obj(_job())["spec"]
    edited = _job(steps=500, runPolicy={"backoffLimit": 7})
    d = _decide(edited, _running_status(), built, gen=2)
    pending = _pending(d)
    assert pending is not None and pending[:2] == ("True", "AppliesAtNextStart")
    assert pending[2].startswith("spec.steps changed: spec generation 2 is not in the running pods")
    assert "taken at once: spec.runPolicy.backoffLimit" in pending[2]
    assert [(e.reason, e.message) for e in d.events] == [("SpecChangePending", pending[2])]
    assert d.create_ranks == [] and d.delete_pods == []
    # said once per edit: the same look again posts nothing
    again = _decide(edited, d.status, built, gen=2)
    assert again.events == [] and _pending(again) == pending


def test_a_change_taken_at_once_raises_no_notice() -> None:
    built = to_obj(_job())["spec"]
    d = _decide(_job(runPolicy={"backoffLimit": 7, "activeDeadlineSeconds": 3600}), _running_status(), built, gen=2)
    assert _pending(d) is None and d.events == []
    assert "spec.runPolicy.backoffLimit" in AT_ONCE


def test_taken_at_once_clears_an_earlier_notice() -> None:
    built = to_obj(_job())["spec"]
    noticed = _decide(_job(steps=500), _running_status(), built, gen=2)
    assert _pending(noticed) is not None
    # the user sets steps back and raises backoffLimit: nothing waits any more
    undone = _decide(_job(runPolicy={"backoffLimit": 7}), noticed.status, built, gen=3)
    assert _pending(undone) == (
        "False",
        "Applied",
        "spec generation 3 changes only what is taken at once: spec.runPolicy.backoffLimit",
    )
    assert undone.events == []


def test_many_fields_are_counted_past_the_first_eight() -> None:
    built = to_obj(_job())["spec"]
    many = _job(
        steps=500,
        trainerImage="example.com/t:2",
        fillImage="example.com/f:2",
        optimizer={"learningRate": 0.001, "weightDecay": 0.2, "beta1": 0.8, "beta2": 0.9, "gradClip": 0.5},
        data={"seed": 3},
    )
    (pending,) = [e.message for e in _decide(many, _running_status(), built, gen=2).events]
    assert pending.split(" changed:")[0].endswith("and 1 more")


def test_without_the_running_spec_the_change_still_waits_with_a_notice() -> None:
    d = _decide(_job(steps=500), _running_status(), None, gen=2)
    pending = _pending(d)
    assert pending is not None and pending[0] == "True"
    assert pending[2].startswith("spec generation 2 is not in the running pods (built from generation 1)")
    assert [e.reason for e in d.events] == ["SpecChangePending"]
