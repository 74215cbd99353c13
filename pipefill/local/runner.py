"""``pipefill local``: run a PipelineTrainingJob and its FillJobs on this machine, as a cluster would, without one.

The runner is the second adapter of the operator's decision core: it validates the manifests with admission's rules,
then, about 5 times a second, observes each rank's processes as its pod (:mod:`pipefill.local.adapter`), asks
:func:`pipefill.lifecycle.decide` — the function the operator's reconcile calls — what to do, and does it: start a
generation (every rank's fill executor first, as a native sidecar starts first, then its trainer), stop one, start
a fill executor again. Restarts, backoff, generations, the Succeeded and Failed verdicts, the conditions and the Events
are the core's, so a job ends here as it would on a cluster; the PipelineTrainingJob status is kept in
``<out>/status.json``, its Events in ``<out>/events.jsonl``. Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipefill.env import fill_max_active_jobs
from pipefill.lifecycle import Decision, Observed, decide, exit_code
from pipefill.lifecycle.checks import spec_problems
from pipefill.lifecycle.conditions import ConditionType, find
from pipefill.lifecycle.exitcodes import exit_text as describe_exit
from pipefill.local.adapter import LocalGang
from pipefill.local.fillqueue import LocalQueue
from pipefill.local.launcher import Launcher
from pipefill.local.procs import (
    LocalProcess,
    free_port,
    local_processes,
    model_code_dir,
    preloaded_launcher,
    schedule_file,
)
from pipefill.local.report import FILL_WORK_DIR
from pipefill.spec import FillJob, JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, SpecError, to_obj

__all__ = ["CONFIG_MAPS_DIR", "LocalRun", "RunOutcome", "prepare"]

_POLL_S = 0.2
# ConfigMaps given with -f (a FillJob's spec.workload.code.configMap), where the files work source reads them:
# <work dir>/configmaps/<name>.yaml (pipefill_fill.configmaps)
CONFIG_MAPS_DIR = "configmaps"
STATUS_FILE = "status.json"  # under --out: the PipelineTrainingJob status, as the operator would write it
EVENTS_FILE = "events.jsonl"  # under --out: the Events the operator would post, one JSON object a line
LAUNCHER_LOG = "launcher.log"  # under --out: the output of the preloaded launcher the children are forked from
_JOB_GENERATION = 1  # metadata.generation: the manifest is read once, so the spec never changes during a run


@dataclass
class RunOutcome:
    """How a local run ended."""

    code: int  # 0 succeeded, 1 failed, 2 invalid input, 130 interrupted
    reason: str
    job_restarts: int = 0
    fill_restarts: int = 0
    events: list[str] = field(default_factory=list)  # "HH:MM:SS <type> <reason>: <message>", as they happened
    # (rank, container) -> restarts of that process alone (a fill executor's); whole-job restarts are job_restarts
    process_restarts: dict[tuple[int, str], int] = field(default_factory=dict)
    status: PipelineTrainingJobStatus = field(default_factory=PipelineTrainingJobStatus)
    records: list[dict[str, str]] = field(default_factory=list)  # the Events as objects: time, type, reason, message


def prepare(
    job: PipelineTrainingJob,
    fills: list[FillJob],
    out_dir: Path,
    *,
    schedule_csv: str | None = None,
    config_maps: Sequence[dict[str, Any]] = (),
) -> tuple[Path, Path]:
    """Write the job and, for ``schedule: custom``, its CSV under its key beside it (as the spec ConfigMap holds
    them), the fill queue and the ConfigMaps its code is in; returns (spec file, work dir)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_file = out_dir / "job.yaml"
    spec_file.write_text(yaml.safe_dump(to_obj(job), sort_keys=False), encoding="utf-8")
    csv_file = schedule_file(job, out_dir)
    if schedule_csv is not None and csv_file is not None:
        csv_file.write_text(schedule_csv, encoding="utf-8")
    work_dir = out_dir / FILL_WORK_DIR
    work_dir.mkdir(exist_ok=True)
    for fill in fills:
        target = work_dir / f"{fill.name}.yaml"
        if not target.exists():  # keep progress of an earlier, interrupted run
            target.write_text(yaml.safe_dump(to_obj(fill), sort_keys=False), encoding="utf-8")
    model_code = job.spec.model.python.code if job.spec.model.python is not None else None
    for config_map in config_maps:  # always this run's: code fixed between runs is picked up
        target = work_dir / CONFIG_MAPS_DIR / f"{config_map['metadata']['name']}.yaml"
        target.parent.mkdir(exist_ok=True)
        target.write_text(yaml.safe_dump(config_map, sort_keys=False), encoding="utf-8")
        if model_code is not None and config_map["metadata"]["name"] == model_code.config_map:
            code_dir = model_code_dir(job, work_dir)  # as the pod mounts it: one file per key
            assert code_dir is not None
            shutil.rmtree(code_dir, ignore_errors=True)
            code_dir.mkdir(parents=True)
            for key, text in (config_map.get("data") or {}).items():
                if "/" in key or key in (".", ".."):
                    raise ValueError(f"ConfigMap {model_code.config_map!r}: key {key!r} is not a file name")
                (code_dir / key).write_text(str(text), encoding="utf-8")
    return spec_file, work_dir


class LocalRun:
    """One local run; ``on_tick`` is called about 5 times a second with the processes (the live view hooks in)."""

    def __init__(
        self,
        job: PipelineTrainingJob,
        fills: list[FillJob],
        *,
        out_dir: Path,
        device: str = "cpu",
        pin: bool = True,
        schedule_csv: str | None = None,
        config_maps: Sequence[dict[str, Any]] = (),
        on_tick: Callable[[list[LocalProcess], RunOutcome], None] | None = None,
        policy: str = "fifo",
    ) -> None:
        self.job, self.fills, self.out_dir, self.device, self.pin = job, fills, out_dir, device, pin
        self.schedule_csv = schedule_csv  # schedule custom: the CSV from its ConfigMap (manifests.load_manifests)
        self.on_tick = on_tick
        self.config_maps = list(config_maps)
        self.outcome = RunOutcome(code=1, reason="not started")
        self.gang: LocalGang | None = None
        self.policy = policy  # the fill queue's (pipefill.queue.POLICIES), as the operator's --policy

    @property
    def procs(self) -> list[LocalProcess]:
        """The processes of the current generation."""
        return [] if self.gang is None else self.gang.procs

    @property
    def work_dir(self) -> Path:
        """The fill executors' work source: the FillJob manifests and their ``<job>.status.json``."""
        return self.out_dir / FILL_WORK_DIR

    def _spawner(
        self, spec_file: Path, work_dir: Path, channel_root: Path, launcher: Launcher | None
    ) -> Callable[[], list[LocalProcess]]:
        def spawn() -> list[LocalProcess]:  # one rendezvous port per generation, as a new gang's pods rendezvous anew
            return local_processes(
                self.job,
                spec_file=spec_file,
                out_dir=self.out_dir,
                work_dir=work_dir,
                channel_root=channel_root,
                master_port=free_port(),
                device=self.device,
                pin=self.pin,
                launcher=launcher,
            )

        return spawn

    def _record(self, decision: Decision) -> None:
        """The decision's Events and status, where the user (and the report) read them."""
        now = datetime.datetime.now(datetime.UTC)
        with (self.out_dir / EVENTS_FILE).open("a", encoding="utf-8") as log:
            for event in decision.events:
                record = {"time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "type": event.type, "reason": event.reason}
                record["message"] = event.message
                self.outcome.records.append(record)
                self.outcome.events.append(f"{now.astimezone():%H:%M:%S} {event.type} {event.reason}: {event.message}")
                log.write(json.dumps(record) + "\n")
        if decision.status != self.outcome.status:
            text = json.dumps(to_obj(decision.status), indent=2) + "\n"
            (self.out_dir / STATUS_FILE).write_text(text, encoding="utf-8")
        self.outcome.status = decision.status
        self.outcome.job_restarts = decision.status.restarts + decision.status.disruptions

    def _ended(self, status: PipelineTrainingJobStatus) -> bool:
        """Whether the run ends with ``status``: the job Succeeded or Failed (or is suspended: nothing runs)."""
        verdict = {JobPhase.SUCCEEDED: ConditionType.SUCCEEDED, JobPhase.FAILED: ConditionType.FAILED}
        if status.phase in verdict:
            found = find(status.conditions, verdict[status.phase])
            message = found.message if found is not None else status.phase.value
            succeeded = status.phase == JobPhase.SUCCEEDED
            self.outcome.code = 0 if succeeded else 1
            self.outcome.reason = f"training finished: {message}" if succeeded else message
            return True
        if status.phase == JobPhase.SUSPENDED:
            self.outcome.code = 1
            self.outcome.reason = "spec.runPolicy.suspend is true: nothing runs; set it to false to run the job"
            return True
        return False

    def run(self) -> RunOutcome:
        spec_file, work_dir = prepare(
            self.job, self.fills, self.out_dir, schedule_csv=self.schedule_csv, config_maps=self.config_maps
        )
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        channel_root = Path(tempfile.mkdtemp(prefix=f"pipefill-{self.job.name}-", dir=shm))
        (self.out_dir / EVENTS_FILE).unlink(missing_ok=True)
        launcher = preloaded_launcher(self.out_dir / LAUNCHER_LOG)
        self.gang = gang = LocalGang(
            self.job, out_dir=self.out_dir, spawn=self._spawner(spec_file, work_dir, channel_root, launcher)
        )
        gang.restarts = self.outcome.process_restarts
        problems = spec_problems(self.job, schedule_csv=self.schedule_csv)  # admission's checks passed already
        queue = None
        if self.fills:
            queue = LocalQueue(
                self.job,
                self.fills,
                work_dir,
                policy=self.policy,
                max_jobs_per_rank=fill_max_active_jobs(),  # the executors' limit: they inherit this environment
                schedule_csv=self.schedule_csv,
            )
        try:
            while True:
                now = datetime.datetime.now(datetime.UTC)
                observed = Observed(pods=gang.views(now), now=now, problems=problems)
                decision = decide(self.job, self.outcome.status, observed, job_generation=_JOB_GENERATION)
                self._record(decision)
                gang.apply(decision)
                if queue is not None:  # the fill queue's pass, as the operator's loop runs it beside the reconciles
                    queue.pass_once(gang.views(now), running=decision.status.phase == JobPhase.RUNNING)
                self.outcome.fill_restarts = sum(self.outcome.process_restarts.values())
                if self._ended(decision.status):
                    return self.outcome
                if self.on_tick is not None:
                    self.on_tick(self.procs, self.outcome)
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            self.outcome.code, self.outcome.reason = (
                130,
                "interrupted (Ctrl-C): every process stopped, checkpoints kept",
            )
            self.outcome.events.append(f"{time.strftime('%H:%M:%S')} {self.outcome.reason}")
            return self.outcome
        finally:
            gang.stop()
            if launcher is not None:
                launcher.close()
            shutil.rmtree(channel_root, ignore_errors=True)
            if queue is not None:  # the executors' last reports in: the status as the cluster's once the job ends
                queue.pass_once([], running=False)


def exit_text(code: int | None) -> str:
    """How a process ended, in the kubelet's terms: ``exited with code 75`` or ``exited with code 137 (SIGKILL)``."""
    return "has not exited" if code is None else describe_exit(exit_code(code))


def describe_error(exc: Exception) -> str:
    """The message for bad input, as admission would phrase it."""
    return str(exc) if isinstance(exc, SpecError | ValueError) else f"{type(exc).__name__}: {exc}"
