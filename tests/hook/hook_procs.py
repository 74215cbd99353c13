"""Run examples/pipelining/train.py as a gloo world of real processes, with or without the bubble hook, and a
consumer on each rank's bubble channel (what a fill executor would be)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from launched import popen, run

from pipefill import env
from pipefill.channel import Bubble, Consumer
from pipefill.events import TRAINER_EVENTS, BubbleEvent, StepEvent, read_events
from pipefill.ports import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "pipelining" / "train.py"
BOOT = REPO / "trainer-image" / "pipefill_hook" / "boot"


@dataclass
class Rank:
    code: int
    output: str
    out_dir: Path
    received: list[Bubble] = field(default_factory=list)

    def bubbles(self) -> list[BubbleEvent]:
        return [e for e in read_events(self.out_dir / TRAINER_EVENTS) if isinstance(e, BubbleEvent)]

    def steps(self) -> list[StepEvent]:
        return [e for e in read_events(self.out_dir / TRAINER_EVENTS) if isinstance(e, StepEvent)]


@dataclass
class Run:
    ranks: list[Rank]
    losses: list[float]


def _consume(channel: Path, into: list[Bubble], stop: threading.Event) -> None:
    with Consumer.attach(channel_dir=channel, timeout_s=60) as ch:
        while not stop.is_set():
            bubble = ch.wait_bubble(timeout_s=0.2)
            if bubble is not None:
                into.append(bubble)
                ch.acknowledge(bubble.id, used_s=0.0)
            elif not ch.trainer_alive():
                return


def run_example(
    tmp: Path, args: list[str], *, hook: bool, world: int = 2, extra_env: dict[str, str] | None = None,
    rank_env: Callable[[int], dict[str, str]] | None = None, consume: bool = True, timeout_s: float = 90,
    during: Callable[[], None] | None = None, script: Path = EXAMPLE,
) -> Run:  # fmt: skip
    """Every rank of ``train.py args``; with ``hook``, PIPEFILL_HOOK=1, the hook on PYTHONPATH, a channel and an
    output directory per rank, and (``consume``) a consumer thread on each channel; ``rank_env``: more variables per
    rank; ``during``: called once all ranks started, before they are awaited; ``script``: another training script
    (run from the repository root; its losses are its own to report)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port, losses_file = free_port(), tmp / "losses.json"
    base_path = os.pathsep.join(
        [str(REPO), str(REPO / "trainer-image"), *filter(None, [os.environ.get("PYTHONPATH", "")])]
    )
    procs, ranks, stops, threads = [], [], [], []
    for rank in range(world):
        out, channel = tmp / f"rank{rank}", tmp / f"channel{rank}"
        proc_env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": base_path,
        }
        if hook:
            proc_env |= {
                "PIPEFILL_HOOK": "1",
                "PYTHONPATH": f"{BOOT}{os.pathsep}{base_path}",
                env.CHANNEL_DIR: str(channel),
                env.OUT_DIR: str(out),
                env.JOB_NAME: "hooked",
                env.FILL_MIN_BUBBLE_MS: "0",
            }
        proc_env |= (extra_env or {}) | (rank_env(rank) if rank_env else {})
        # the script as its module, its directory on the path: the rank forks from a preloaded launcher, one per
        # start-up environment (the hooked ranks' launcher ran the hook's sitecustomize, as a fresh interpreter of
        # theirs would; the hook wraps the schedules when the rank imports them, after the fork)
        cmd = [sys.executable, "-m", script.stem, *args, *(["--losses", str(losses_file)] if script == EXAMPLE else [])]
        proc_env["PYTHONPATH"] = f"{script.parent}{os.pathsep}{proc_env['PYTHONPATH']}"
        procs.append(popen(cmd, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO))
        ranks.append(Rank(0, "", out))
        if hook and consume:
            stop = threading.Event()
            t = threading.Thread(target=_consume, args=(channel, ranks[-1].received, stop), daemon=True)
            t.start()
            stops.append(stop)
            threads.append(t)
    try:
        if during is not None:
            during()
        for rank_out, proc in zip(ranks, procs, strict=True):
            rank_out.output, _ = proc.communicate(timeout=timeout_s)
            rank_out.code = proc.returncode
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        for stop in stops:
            stop.set()
        for t in threads:
            t.join(timeout=10)
    for r in ranks:
        assert r.code == 0, r.output
    return Run(ranks, json.loads(losses_file.read_text()) if losses_file.exists() else [])


def run_local(tmp: Path, job: dict[str, Any], *, steps: int) -> tuple[dict[str, Any], Path]:
    """``pipefill local`` of ``job`` with the inference FillJob of the examples (its output under ``tmp``, not the
    checkout's runs/, where the progress of every earlier run is), from the repository root: the report (checked: the
    training finished after ``steps`` steps and the FillJob committed work) and the output directory."""
    tmp.mkdir(parents=True, exist_ok=True)
    job_file, out, fill = tmp / "job.yaml", tmp / "out", tmp / "fill.yaml"
    job_file.write_text(yaml.safe_dump(job))
    fill_job = yaml.safe_load((REPO / "examples" / "fill-inference.yaml").read_text())
    fill_job["spec"]["output"]["path"] = str(tmp / "fill-out")
    fill.write_text(yaml.safe_dump(fill_job))
    done = run(
        [sys.executable, "-m", "pipefill", "local", "-f", str(job_file), "-f", str(fill), "--out", str(out),
         "--plain", "--no-timeline", "--metrics-port", "0"],
        capture_output=True, text=True, timeout=115, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    finished = "training finished: every rank's trainer finished (generation 0)"  # the decision core's verdict
    assert report["outcome"]["reason"] == finished and report["steps"] == steps
    assert report["fill_jobs"]["embed-corpus"]["committed"] > 0, "the FillJob made no progress in the bubbles"
    return report, out
