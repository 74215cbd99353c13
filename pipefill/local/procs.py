"""Local processes for a rank's containers, derived from the same description the operator turns into a Pod.

``pipefill.pods.rank_containers`` gives every container's module and environment; this module only remaps what
differs on one machine: the channel directory (a per-rank directory on tmpfs instead of an emptyDir), the spec file,
the rendezvous address, metrics ports, the fill's work source, output directories, and CPU pinning (one core plays
one GPU: a stage's trainer and its fill executor share that core).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pipefill import env
from pipefill.local import early
from pipefill.local.launcher import Forked, Launcher, child_environment, preload_wanted, signal_group
from pipefill.pods import rank_containers
from pipefill.ports import free_port
from pipefill.spec import PipelineTrainingJob, Schedule
from pipefill.usercommand import local_argv, local_command_env

__all__ = [
    "LocalProcess",
    "child_environment",
    "free_port",
    "local_processes",
    "preloaded_launcher",
    "schedule_file",
    "stop_all",
]


@dataclass
class LocalProcess:
    """One container of one rank, run as a local process."""

    rank: int
    container: str  # "trainer" or "fill-executor"
    argv: list[str]
    env: dict[str, str]
    out_dir: Path
    metrics_port: int
    launcher: Launcher | None = field(default=None, repr=False)  # forks it preloaded where it can (launcher.py)
    child: subprocess.Popen[bytes] | Forked | None = None
    restarts: int = 0
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"rank{self.rank}/{self.container}"

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        log = self.out_dir / "output.log"
        self.child = None if self.launcher is None else self.launcher.launch(self.argv, self.env, log)
        if self.child is not None:
            return
        self.log = open(log, "ab")  # noqa: SIM115 (kept open while the process runs)
        self.child = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,  # Ctrl-C reaches the runner only (it stops them in order); one session: launcher.py
        )

    def poll(self) -> int | None:
        return None if self.child is None else self.child.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it ended (``subprocess.TimeoutExpired`` after ``timeout`` s); None: never started."""
        return None if self.child is None else self.child.wait(timeout)

    def signal(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            signal_group(self.child.pid, signum)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


MODEL_CODE_DIR = "model-code"  # under the work directory: spec.model.python.code.configMap's files


def model_code_dir(job: PipelineTrainingJob, work_dir: Path) -> Path | None:
    """Where the trainer finds ``spec.model.python.code`` locally: the ConfigMap's files (written by the runner under
    the work directory) or ``code.path`` under the working directory (as a FillJob's code.path); None: no code."""
    code = job.spec.model.python.code if job.spec.model.python is not None else None
    if code is None:
        return None
    return work_dir / MODEL_CODE_DIR if code.config_map else Path.cwd() / (code.path or "")


def schedule_file(job: PipelineTrainingJob, spec_dir: Path) -> Path | None:
    """Where a custom schedule's CSV lies: under its ConfigMap key beside ``job.yaml``, as in the pod's mount of the
    spec ConfigMap; None unless ``schedule: custom``."""
    ref = job.spec.pipeline.custom_schedule
    if job.spec.pipeline.schedule != Schedule.CUSTOM or ref is None:
        return None
    return spec_dir / ref.key


def _cpu_for(rank: int, stages: int) -> str:
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[(rank % stages) % len(cpus)])


def preloaded_launcher(log: Path) -> Launcher | None:
    """The launcher children are forked from (torch imported once, launcher.py), its output in ``log``; None where
    ``PIPEFILL_LOCAL_PRELOAD=0`` (each child then imports torch itself). The one ``pipefill local`` started before
    its own imports (early.py) where it has this environment."""
    if not preload_wanted():
        return None
    environ = child_environment()
    return early.take(environ, log) or Launcher(environ, log)


def local_processes(
    job: PipelineTrainingJob,
    *,
    spec_file: Path,
    out_dir: Path,
    work_dir: Path,
    channel_root: Path,
    master_port: int,
    device: str = "cpu",
    pin: bool = True,
    launcher: Launcher | None = None,
) -> list[LocalProcess]:
    """Every container of every rank, fill executors first (as native sidecars start first); ``launcher``: started
    preloaded where it can (else with ``Popen``)."""
    procs: list[LocalProcess] = []
    for rank in range(job.world_size):
        channel = channel_root / f"rank{rank}"
        channel.mkdir(parents=True, exist_ok=True)
        for plan in rank_containers(job, rank):
            child = child_environment(plan.env)
            port = free_port()
            rank_out = out_dir / "ranks" / str(rank) / plan.name
            child.update(
                {
                    env.CHANNEL_DIR: str(channel),
                    env.METRICS_PORT: str(port),
                    env.OUT_DIR: str(rank_out),
                    env.DEVICE: device,
                }
            )
            if pin and device == "cpu":
                child[env.CPU_AFFINITY] = _cpu_for(rank, job.spec.pipeline.stages)
            if plan.name == "trainer":
                child.update(
                    {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port), env.SPEC_FILE: str(spec_file)}
                )
                csv = schedule_file(job, spec_file.parent)
                if csv is not None:  # as the pod sets it (never one inherited from this shell)
                    child[env.SCHEDULE_FILE] = str(csv)
                code = model_code_dir(job, work_dir)
                if code is not None:  # the ConfigMap's files written by the runner, or the working directory's
                    child[env.MODEL_CODE_DIR] = str(code)
            else:
                child[env.WORK_SOURCE] = f"files:{work_dir}"
                child[env.FILL_PROFILE_DIR] = str(work_dir / "profiles")  # one cache for every rank and job of the run
            if plan.name == "trainer" and job.spec.trainer is not None:  # the user's command (pipefill.usercommand)
                local_command_env(job, child, master_port=master_port)
            argv = local_argv(plan.argv)
            procs.append(LocalProcess(rank, plan.name, argv, child, rank_out, port, launcher))
    procs.sort(key=lambda p: (p.container != "fill-executor", p.rank))
    return procs


def stop_all(procs: list[LocalProcess], *, grace_s: float = 10.0) -> None:
    """SIGTERM trainers first (they checkpoint), then fill executors; SIGKILL what is left after ``grace_s``."""
    for container in ("trainer", "fill-executor"):
        group = [p for p in procs if p.container == container]
        for p in group:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in group) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in group:
            p.signal(signal.SIGKILL)
            p.wait()
            p.close()
