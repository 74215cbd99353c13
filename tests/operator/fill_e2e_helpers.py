"""Helpers of the end-to-end FillJob test: a rank pod's fill executor as a real process (``python -m pipefill_fill``
with the kubernetes work source and the pod's identity in its environment, since kwok pods run nothing), fed by the
synthetic trainer on a real bubble channel, authenticated as the namespace's fill ServiceAccount (the operator's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launched import popen
from waiting import wait_for

from pipefill import env
from pipefill.children import FILL_ACCOUNT
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

    def freeze_between_commits(self) -> None:
        """SIGSTOP the executor at a moment it holds no file lock (no commit or recovery under way). Frozen inside
        a commit, it would keep its slice's commit lock, and the takeover's recovery would wait for it for good (on
        shared storage a lost client's lock goes when its lease expires; a local flock of a stopped process never)."""
        pid, stat = str(self.executor.pid), Path(f"/proc/{self.executor.pid}/stat")
        for _ in range(500):
            self.executor.send_signal(signal.SIGSTOP)
            state = lambda: stat.read_text().rsplit(")", 1)[1].split()[0]  # noqa: E731
            wait_for(
                state, f"executor {pid} to stop", 10, 0.001, until=lambda s: s in ("T", "t")
            )  # it holds what it holds
            holders = [line.split() for line in Path("/proc/locks").read_text().splitlines() if "->" not in line]
            if not any(len(f) > 4 and f[1] == "FLOCK" and f[4] == pid for f in holders):
                return
            self.executor.send_signal(signal.SIGCONT)
            time.sleep(0.005)  # let it finish the commit
        raise AssertionError(f"executor {pid} held a lock at each of 500 tries")

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
    kubeconfig = cp.kubeconfig_for(namespace, FILL_ACCOUNT)  # the namespace's fill identity (its Role only)
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
    executor = popen([sys.executable, "-m", "pipefill_fill"], env=child, stderr=subprocess.PIPE, text=True)
    return RankExecutor(name, uid, producer, executor, out)
