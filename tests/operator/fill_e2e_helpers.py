"""Helpers of the end-to-end FillJob test: a rank pod's fill executor as a real process (``python -m pipefill_fill``
with the kubernetes work source and the pod's identity in its environment, since kwok pods run nothing), fed by the
synthetic trainer on a real bubble channel, authenticated as the training job's own fill ServiceAccount."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.devcluster import ControlPlane
from pipefill.pods import RANK_LABEL

_TESTS = Path(__file__).resolve().parents[1]


@dataclass
class RankExecutor:
    """One rank pod's trainer stand-in (the bubble producer) and fill executor, both real processes."""

    pod: str
    uid: str
    producer: subprocess.Popen[str]
    executor: subprocess.Popen[str]
    out: Path

    def signal(self, sig: int) -> None:
        self.executor.send_signal(sig)

    def stop(self) -> str:
        """Stop both (the executor first, as the kubelet's SIGTERM would); the executor's stderr."""
        for proc in (self.executor, self.producer):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        err = ""
        try:
            _, err = self.executor.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.executor.kill()
            _, err = self.executor.communicate()
        self.producer.communicate(timeout=30)
        return err or ""


def start_rank(
    cp: ControlPlane, namespace: str, pod: dict[str, Any], *, job: str, workdir: Path, bubbles_ms: str = "30,10,60"
) -> RankExecutor:
    """The producer and executor of ``pod`` (a rank pod of training job ``job``) on a channel under ``workdir``."""
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    rank = int(pod["metadata"]["labels"][RANK_LABEL])
    base = workdir / name
    channel, out = base / "channel", base / "out"
    out.mkdir(parents=True, exist_ok=True)
    child = dict(os.environ)
    child.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    producer = subprocess.Popen(
        [sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(channel), "--bubbles-ms",
         bubbles_ms, "--compute-ms", "15", "--count", "1000000"],
        env=child, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    kubeconfig = cp.kubeconfig_for(namespace, f"{job}-fill")  # the training job's fill identity (its Role only)
    child.update(
        {
            env.CHANNEL_DIR: str(channel),
            env.WORK_SOURCE: "kubernetes",
            env.OUT_DIR: str(out),
            env.JOB_NAME: job,
            env.RANK: str(rank),
            env.DEVICE: "cpu",
            env.FILL_GUARD_MS: "1",
            env.POD_NAMESPACE: namespace,
            env.POD_UID: uid,
            "HOSTNAME": name,
            "KUBECONFIG": str(kubeconfig),
        }
    )
    executor = subprocess.Popen([sys.executable, "-m", "pipefill_fill"], env=child, stderr=subprocess.PIPE, text=True)
    return RankExecutor(name, uid, producer, executor, out)
