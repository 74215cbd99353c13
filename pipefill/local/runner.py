"""``pipefill local``: run a PipelineTrainingJob and its FillJobs on this machine, as a cluster would, without one.

The runner plays the operator and the kubelet: it validates the manifests with admission's rules, starts every
rank's fill executor (first, as a native sidecar starts first) and trainer as local processes, restarts a crashed
fill executor on its own (training goes on), restarts the whole job from its checkpoints when a trainer fails with
a retryable exit code (up to ``spec.runPolicy.backoffLimit``), and stops everything cleanly on Ctrl-C.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipefill.events import ExitEvent, read_events
from pipefill.lifecycle.exitcodes import ExitClass, classify, exit_code
from pipefill.lifecycle.exitcodes import exit_text as describe_exit
from pipefill.local.procs import LocalProcess, free_port, local_processes, model_code_dir, schedule_file, stop_all
from pipefill.local.report import FILL_WORK_DIR, rank_log_paths
from pipefill.spec import FillJob, PipelineTrainingJob, SpecError, to_obj

__all__ = ["CONFIG_MAPS_DIR", "LocalRun", "RunOutcome", "prepare"]

_POLL_S = 0.2
# ConfigMaps given with -f (a FillJob's spec.workload.code.configMap), where the files work source reads them:
# <work dir>/configmaps/<name>.yaml (pipefill_fill.configmaps)
CONFIG_MAPS_DIR = "configmaps"
_FILL_RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def _left_with_its_trainer(out_dir: Path, proc: LocalProcess) -> bool:
    """A fill executor that exited 0 because its trainer stopped announcing (its last ``exit`` record says "trainer
    gone"): the trainer has finished its steps and is saving or exiting, or it hangs and its peers' timeout restarts
    the job, which starts the executor again. Restarting it would attach to a channel nobody announces on (and, timed
    against a slow final save, made a finished run report a fill restart)."""
    if proc.poll() != 0:
        return False
    last = next(
        (e for e in reversed(read_events(rank_log_paths(out_dir, proc.rank)[1])) if isinstance(e, ExitEvent)), None
    )
    return last is not None and last.reason == "trainer gone"


@dataclass
class RunOutcome:
    """How a local run ended."""

    code: int  # 0 succeeded, 1 failed, 2 invalid input, 130 interrupted
    reason: str
    job_restarts: int = 0
    fill_restarts: int = 0
    events: list[str] = field(default_factory=list)
    # (rank, container) -> restarts of that process alone (a fill executor's); whole-job restarts are job_restarts
    process_restarts: dict[tuple[int, str], int] = field(default_factory=dict)


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
    ) -> None:
        self.job, self.fills, self.out_dir, self.device, self.pin = job, fills, out_dir, device, pin
        self.schedule_csv = schedule_csv  # schedule custom: the CSV from its ConfigMap (manifests.load_manifests)
        self.on_tick = on_tick
        self.config_maps = list(config_maps)
        self.outcome = RunOutcome(code=1, reason="not started")
        self.procs: list[LocalProcess] = []

    @property
    def work_dir(self) -> Path:
        """The fill executors' work source: the FillJob manifests and their ``<job>.status.json``."""
        return self.out_dir / FILL_WORK_DIR

    def _spawn(self, spec_file: Path, work_dir: Path, channel_root: Path) -> None:
        self.procs = local_processes(
            self.job,
            spec_file=spec_file,
            out_dir=self.out_dir,
            work_dir=work_dir,
            channel_root=channel_root,
            master_port=free_port(),
            device=self.device,
            pin=self.pin,
        )
        for proc in self.procs:
            proc.start()

    def _note(self, text: str) -> None:
        self.outcome.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def run(self) -> RunOutcome:
        spec_file, work_dir = prepare(
            self.job, self.fills, self.out_dir, schedule_csv=self.schedule_csv, config_maps=self.config_maps
        )
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        channel_root = Path(tempfile.mkdtemp(prefix=f"pipefill-{self.job.name}-", dir=shm))
        policy = self.job.spec.run_policy
        fill_restart_at: dict[int, float] = {}
        left: set[tuple[int, int]] = set()  # (process, its restarts) of executors that left with their trainer
        try:
            self._spawn(spec_file, work_dir, channel_root)
            while True:
                trainers = [p for p in self.procs if p.container == "trainer"]
                codes = [p.poll() for p in trainers]
                # kubelet-form exit codes (a signal death -N is 128 + N), classified as the operator does; a
                # non-retryable exit of any rank decides, whatever its peers exit with
                failed = [(p, exit_code(c)) for p, c in zip(trainers, codes, strict=True) if c not in (None, 0)]
                failed.sort(key=lambda pc: classify(pc[1], policy.restart_on_exit_codes) == ExitClass.RETRYABLE)
                if failed:
                    proc, code = failed[0]
                    tail = _tail(proc.out_dir / "output.log")
                    retryable = classify(code, policy.restart_on_exit_codes) == ExitClass.RETRYABLE
                    if retryable and self.outcome.job_restarts < policy.backoff_limit:
                        self.outcome.job_restarts += 1
                        self._note(
                            f"{proc.name} {exit_text(code)} (retryable): restarting the job from its checkpoints ({self.outcome.job_restarts}/{policy.backoff_limit})"
                        )
                        stop_all(self.procs)
                        left.clear()
                        self._spawn(spec_file, work_dir, channel_root)
                        continue
                    self.outcome.code, self.outcome.reason = 1, f"{proc.name} {exit_text(code)}: {tail}"
                    self._note(self.outcome.reason)
                    return self.outcome
                if all(c == 0 for c in codes):
                    self.outcome.code, self.outcome.reason = 0, "training finished"
                    self._note("all trainers finished")
                    return self.outcome
                finished = {p.rank for p in self.procs if p.container == "trainer" and p.poll() == 0}
                for i, proc in enumerate(self.procs):
                    if proc.container != "fill-executor" or proc.poll() is None:
                        continue
                    if proc.rank in finished:  # its trainer is done, so is its pod's sidecar: nothing to restart
                        continue
                    if (i, proc.restarts) in left or (
                        i not in fill_restart_at and _left_with_its_trainer(self.out_dir, proc)
                    ):
                        left.add((i, proc.restarts))  # its log is read once
                        continue  # its trainer is finishing (the final save): the job restart, if any, starts it
                    due = fill_restart_at.setdefault(
                        i, time.monotonic() + _FILL_RESTART_BACKOFF_S[min(proc.restarts, 4)]
                    )
                    if time.monotonic() >= due:
                        self._note(f"{proc.name} {exit_text(proc.poll())}: restarted (training goes on)")
                        proc.close()
                        proc.restarts += 1
                        self.outcome.fill_restarts += 1
                        key = (proc.rank, proc.container)
                        self.outcome.process_restarts[key] = self.outcome.process_restarts.get(key, 0) + 1
                        proc.start()
                        del fill_restart_at[i]
                if self.on_tick is not None:
                    self.on_tick(self.procs, self.outcome)
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            self.outcome.code, self.outcome.reason = (
                130,
                "interrupted (Ctrl-C): every process stopped, checkpoints kept",
            )
            self._note(self.outcome.reason)
            return self.outcome
        finally:
            stop_all(self.procs)
            shutil.rmtree(channel_root, ignore_errors=True)


def exit_text(code: int | None) -> str:
    """How a process ended, in the kubelet's terms: ``exited with code 75`` or ``exited with code 137 (SIGKILL)``."""
    return "has not exited" if code is None else describe_exit(exit_code(code))


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) if text else "(no output)"


def describe_error(exc: Exception) -> str:
    """The message for bad input, as admission would phrase it."""
    return str(exc) if isinstance(exc, SpecError | ValueError) else f"{type(exc).__name__}: {exc}"
