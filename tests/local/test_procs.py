"""Local processes carry exactly the environment the operator gives the containers, remapped only where a single
machine differs (channel directory, spec file, rendezvous, ports, work source, output, pinning)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from pipefill import env
from pipefill.local.procs import local_processes
from pipefill.pods import rank_containers
from pipefill.ports import free_port
from pipefill.spec import load_training_job

ROOT = Path(__file__).resolve().parents[2]
REMAPPED = {
    env.CHANNEL_DIR,
    env.METRICS_PORT,
    env.OUT_DIR,
    env.DEVICE,
    env.SPEC_FILE,
    env.WORK_SOURCE,
    "MASTER_ADDR",
    "MASTER_PORT",
}


def test_local_env_equals_pod_env_except_the_remapped_keys(tmp_path: Path) -> None:
    job = load_training_job(ROOT / "examples" / "cpu-demo.yaml")
    procs = local_processes(
        job,
        spec_file=tmp_path / "job.yaml",
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
        channel_root=tmp_path / "shm",
        master_port=12345,
    )
    assert [(p.rank, p.container) for p in procs] == [
        (0, "fill-executor"),
        (1, "fill-executor"),
        (0, "trainer"),
        (1, "trainer"),
    ]
    for proc in procs:
        (plan,) = [c for c in rank_containers(job, proc.rank) if c.name == proc.container]
        for key, value in plan.env.items():
            if key not in REMAPPED:
                assert proc.env[key] == value, key
        assert proc.argv[1:] == plan.argv[1:]
        assert proc.env[env.CHANNEL_DIR] == str(tmp_path / "shm" / f"rank{proc.rank}")
        assert Path(proc.env[env.CHANNEL_DIR]).is_dir()
    trainers = [p for p in procs if p.container == "trainer"]
    assert {p.env["MASTER_PORT"] for p in trainers} == {"12345"}
    assert {p.env["MASTER_ADDR"] for p in trainers} == {"127.0.0.1"}
    fills = [p for p in procs if p.container == "fill-executor"]
    assert {p.env[env.WORK_SOURCE] for p in fills} == {f"files:{tmp_path / 'work'}"}
    # a stage's trainer and fill executor share one core
    for rank in (0, 1):
        pair = {p.env.get(env.CPU_AFFINITY) for p in procs if p.rank == rank}
        assert len(pair) == 1
    assert len({p.metrics_port for p in procs}) == len(procs)


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_listened_on() -> None:
    """A port from the ephemeral range can be taken by another process's outgoing connection before the listener
    binds it (a fill executor's metrics port was, and the executor restarted on it forever)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(p < low for p in ports) and len(ports) > 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_a_child_whose_parent_is_gone_before_it_asked_stops_at_once() -> None:
    """The parent died between the child's start and its PR_SET_PDEATHSIG request: the kernel would never send the
    signal, so the child sends it to itself. Without PIPEFILL_PARENT_PID (a container) nothing happens."""
    code = (
        "import sys, time\nfrom pipefill.parent import stop_with_parent\n"
        "assert not stop_with_parent({})\n"
        "stop_with_parent({'PIPEFILL_PARENT_PID': sys.argv[1]})\ntime.sleep(30)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, "1"], timeout=20, capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM, done.stderr
