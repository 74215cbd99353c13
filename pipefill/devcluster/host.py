"""What a real node changes on the host, found and undone: sysctls, cgroups, mounts, and processes it leaves behind.

The kubelet sets six kernel tunables when it starts (``setupKernelTunables``), creates the pods' cgroups, bind-mounts
its root directory shared, and mounts every container's root filesystem and every memory volume; containerd's shims
outlive containerd on purpose. ``pipefill cluster down`` must leave none of it, so each is found from the kernel's own
view (``/proc``, ``/sys/fs/cgroup``), not from what the components say they did.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

__all__ = [
    "CREATED_PATHS",
    "SYSCTLS",
    "cgroup_dirs",
    "kill_cgroup",
    "make_cgroup",
    "mounts_under",
    "processes_mentioning",
    "read_sysctls",
    "remove_cgroup",
    "restore_sysctls",
    "unmount_under",
]

# The tunables the kubelet 1.36 sets (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Host paths the kubelet makes whatever its configuration says: its device-plugin socket (a constant of the device
# plugin API), the links to container logs, and util-linux's mount table directory (the kubelet runs mount). Each is
# removed at down if it did not exist before the node started.
CREATED_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/run/mount", "/usr/libexec/kubernetes")
_CGROUP = Path("/sys/fs/cgroup")
_MNT_DETACH = 2


def read_sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in SYSCTLS}


def restore_sysctls(saved: dict[str, str]) -> list[str]:
    """Write back every tunable that differs from ``saved``; returns the names restored."""
    restored = []
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        if path.read_text().strip() != value:
            path.write_text(value + "\n")
            restored.append(name)
    return restored


def _hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies: the v1 controllers' directories, or the v2 root alone."""
    if (_CGROUP / "cgroup.controllers").exists():
        return [_CGROUP]
    return sorted(p for p in _CGROUP.iterdir() if p.is_dir() and not p.is_symlink())


def cgroup_dirs(name: str) -> list[Path]:
    """``name`` (``/pipefill-<tag>``) in every hierarchy where it exists."""
    return [h / name.lstrip("/") for h in _hierarchies() if (h / name.lstrip("/")).is_dir()]


def make_cgroup(name: str) -> None:
    """Create ``name`` in every hierarchy: the kubelet refuses a cgroup root that does not exist. A new cpuset
    cgroup starts with no CPUs and no memory nodes, so those are copied from the parent."""
    for hierarchy in _hierarchies():
        path = hierarchy / name.lstrip("/")
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def _pids(directory: Path) -> set[int]:
    found: set[int] = set()
    for procs in directory.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            found.update(int(line) for line in procs.read_text().split())
    return found


def kill_cgroup(name: str, *, timeout_s: float = 15.0) -> int:
    """SIGKILL every process under ``name`` until none is left (a dying container may fork); returns how many."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = set().union(*(_pids(d) for d in cgroup_dirs(name)))
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    return len(killed)


def remove_cgroup(name: str) -> None:
    """Remove ``name`` and everything below it, deepest first, in every hierarchy (all must be empty of processes)."""
    for top in cgroup_dirs(name):
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()
        with contextlib.suppress(FileNotFoundError):
            top.rmdir()


def _unescape(field: str) -> str:
    """A mount point as /proc/self/mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(*roots: Path) -> list[str]:
    """Every mount point at or below one of ``roots`` in this mount namespace, deepest first."""
    prefixes = [str(r.resolve()) for r in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(points, key=lambda p: -p.count("/"))


def unmount_under(*roots: Path) -> int:
    """Lazily unmount everything below ``roots`` (a bind mount may be stacked several times); returns how many."""
    libc = ctypes.CDLL(None, use_errno=True)
    count = 0
    for _ in range(10):
        points = mounts_under(*roots)
        if not points:
            break
        for point in points:
            if libc.umount2(point.encode(), _MNT_DETACH) == 0:
                count += 1
    return count


def processes_mentioning(*needles: str) -> list[int]:
    """PIDs whose command line contains one of ``needles`` (the node's socket or directory): containerd's shims are
    found this way, since they leave containerd's process group and session on purpose."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(int(entry.name))
    return found
