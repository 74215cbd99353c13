"""Build the control plane's binaries and the real node's from their Go modules, once, into a cache outside the
repository.

Each tool is one small Go module under ``cluster/tools/<module>/`` whose ``go.mod`` names the upstream command as a
``tool`` dependency and pins every version (the go.mod files are the one place the versions live; ``go.sum`` makes the
build reproducible). Nothing of upstream is copied into this repository. ``kube`` builds our own ``main.go``: one
multi-call binary for kube-apiserver, kube-controller-manager and kube-scheduler (one link instead of three), run by
the three names linked to it; ``pause`` is our own program too (node.py). The real node's kubelet, containerd (with its
runc shim, ``ctr`` and the loopback CNI plugin) and runc come from upstream like the rest; runc alone is built with cgo
(its ``nsenter`` is C, and it links libseccomp). A build lands in ``$PIPEFILL_BINS/<module>-<version>-<key>/`` (default
``~/.cache/pipefill/bins``) where the key hashes the module's files and the build flags, so a version bump builds anew
and an unchanged module is never rebuilt.

``python3 -P pipefill/devcluster/bins.py`` builds them all with the standard library alone (this file imports nothing
else), so ``make test`` builds them while pip fills the venv.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "CONTROL_PLANE",
    "MODULES",
    "NODE",
    "BinaryMissing",
    "GoModule",
    "binary",
    "bins_dir",
    "ensure_built",
    "tools_dir",
]


class BinaryMissing(RuntimeError):
    """A control-plane binary is not built yet (or cannot be built here)."""


@dataclass(frozen=True)
class GoModule:
    """One module under cluster/tools/ and the commands it builds."""

    name: str  # directory under cluster/tools/
    packages: tuple[str, ...]  # Go packages of the upstream commands ("." : the module's own main.go)
    binaries: tuple[str, ...]  # output names, same order as ``packages``
    upstream: str  # the module whose version the go.mod pins ("": our own program, versioned by its files' hash)
    version_vars: tuple[str, ...] = ()  # ``-X`` variables that receive the upstream version
    links: tuple[str, ...] = ()  # names linked to a multi-call module's one binary, which runs as the name run by
    tags: tuple[str, ...] = ()  # Go build tags
    cgo: bool = False  # runc needs cgo (its nsenter is C) and libseccomp; everything else is static Go

    @property
    def commands(self) -> tuple[str, ...]:
        """What :func:`binary` finds in this module: the links of a multi-call binary, otherwise the binaries."""
        return self.links or self.binaries

    def version(self) -> str:
        """The pinned upstream version, read from go.mod."""
        if not self.upstream:
            return "local"
        text = (tools_dir() / self.name / "go.mod").read_text()
        match = re.search(rf"^\s*{re.escape(self.upstream)} (v\S+)", text, re.MULTILINE)
        if not match:
            raise BinaryMissing(f"cluster/tools/{self.name}/go.mod does not require {self.upstream}")
        return match.group(1)

    def ldflags(self) -> str:
        version = self.version()
        flags = ["-s", "-w"]
        for var in self.version_vars:
            value = version
            if var.endswith("gitMajor"):
                value = version.lstrip("v").split(".")[0]
            elif var.endswith("gitMinor"):
                value = version.lstrip("v").split(".")[1]
            flags.append(f"-X {var}={value}")
        return " ".join(flags)


_K8S_VERSION_VARS = tuple(
    f"{pkg}.{var}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for var in ("gitVersion", "gitMajor", "gitMinor")
)

MODULES: dict[str, GoModule] = {
    "etcd": GoModule("etcd", ("go.etcd.io/etcd/server/v3",), ("etcd",), "go.etcd.io/etcd/server/v3"),
    "kube": GoModule(
        "kube",
        (".",),  # cluster/tools/kube/main.go: the three commands in one binary
        ("kube",),
        "k8s.io/kubernetes",
        _K8S_VERSION_VARS,
        links=("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
    ),
    "kwok": GoModule("kwok", ("sigs.k8s.io/kwok/cmd/kwok",), ("kwok",), "sigs.k8s.io/kwok"),
    "helm": GoModule(
        "helm",
        ("helm.sh/helm/v4/cmd/helm",),
        ("helm",),
        "helm.sh/helm/v4",
        ("helm.sh/helm/v4/internal/version.version",),
    ),
    # The real node (pipefill/devcluster/node.py): the kubelet, containerd with its runc shim and the loopback CNI
    # plugin, runc, and our own pause program (the sandbox image, and the smallest workload of the node's tests).
    "kubelet": GoModule(
        "kubelet", ("k8s.io/kubernetes/cmd/kubelet",), ("kubelet",), "k8s.io/kubernetes", _K8S_VERSION_VARS
    ),
    "containerd": GoModule(
        "containerd",
        (
            "github.com/containerd/containerd/v2/cmd/containerd",
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            "github.com/containerd/containerd/v2/cmd/ctr",
            "github.com/containernetworking/plugins/plugins/main/loopback",
        ),
        ("containerd", "containerd-shim-runc-v2", "ctr", "loopback"),
        "github.com/containerd/containerd/v2",
        tags=("no_btrfs", "urfave_cli_no_docs"),
    ),
    "runc": GoModule(
        "runc",
        ("github.com/opencontainers/runc",),
        ("runc",),
        "github.com/opencontainers/runc",
        tags=("seccomp", "urfave_cli_no_docs"),
        cgo=True,
    ),
    "pause": GoModule("pause", (".",), ("pause",), ""),
}
CONTROL_PLANE = ("etcd", "kube", "kwok", "helm")
NODE = ("kubelet", "containerd", "runc", "pause")  # the real node's (node.py)
_BY_BINARY = {b: m for m in MODULES.values() for b in m.commands}
# No DWARF from the compiler: the linker drops it anyway (-s -w), and not making it saves about 7 % of the CPU time.
_GCFLAGS = "all=-dwarf=false"


def tools_dir() -> Path:
    """``cluster/tools`` of this checkout (the devcluster runs from a clone of the repository)."""
    return Path(__file__).resolve().parents[2] / "cluster" / "tools"


def bins_dir() -> Path:
    """``$PIPEFILL_BINS`` or ``~/.cache/pipefill/bins``: outside the repository, kept across clones, so a fresh clone
    builds nothing twice (Prometheus for the dashboard checks lands here too, see the Makefile)."""
    return Path(os.environ.get("PIPEFILL_BINS") or Path.home() / ".cache" / "pipefill" / "bins")


def _key(module: GoModule) -> str:
    digest = hashlib.sha256()
    root = tools_dir() / module.name
    for path in sorted([root / "go.mod", root / "go.sum", *root.glob("*.go")]):
        if path.name == "go.sum" and not path.exists():  # a module without dependencies (pause) has none
            continue
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(module.ldflags().encode())
    digest.update(_GCFLAGS.encode())
    if module.tags or module.cgo:  # (not hashed before: the keys of the modules without them stay as they were)
        digest.update(f"tags={','.join(module.tags)} cgo={module.cgo}".encode())
    return digest.hexdigest()[:12]


def _out_dir(module: GoModule) -> Path:
    return bins_dir() / f"{module.name}-{module.version()}-{_key(module)}"


def binary(name: str) -> Path:
    """Path of a built binary; :class:`BinaryMissing` with the command that builds it when it is not there."""
    module = _BY_BINARY[name]
    path = _out_dir(module) / name
    if not (path.parent / ".complete").exists():
        raise BinaryMissing(
            f"{name} {module.version()} is not built (looked in {path.parent}); run `make cluster-bins`"
        )
    return path


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BinaryMissing(
            "no Go toolchain found on PATH: the control plane (etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler, kwok) and helm are built from their Go modules; install Go ≥ 1.26 and run `make cluster-bins`"
        )
    return go


def _build(module: GoModule, log: Callable[[str], None]) -> None:
    out = _out_dir(module)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cgo = "1" if module.cgo else "0"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -buildvcs=false", "CGO_ENABLED": cgo}
    target = [f"-o={tmp}/{module.binaries[0]}"] if len(module.packages) == 1 else [f"-o={tmp}/"]
    flags = ["-trimpath", f"-gcflags={_GCFLAGS}", f"-ldflags={module.ldflags()}"]
    if module.tags:
        flags.append(f"-tags={','.join(module.tags)}")
    argv = [_go(), "build", *flags, *target, *module.packages]
    log(f"building {', '.join(module.commands)} from {module.upstream} {module.version()} …")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=tools_dir() / module.name, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise BinaryMissing(f"`go build` of cluster/tools/{module.name} failed (exit {proc.returncode}):\n{tail}")
    for link in module.links:
        (tmp / link).symlink_to(module.binaries[0])  # relative: the directory is renamed next
    (tmp / ".complete").write_text(f"{module.upstream} {module.version()}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"built {', '.join(module.commands)} in {time.monotonic() - started:.0f} s → {out}")


def ensure_built(names: tuple[str, ...] = tuple(MODULES), *, log: Callable[[str], None] | None = None) -> None:
    """Build every module in ``names`` whose binaries are missing; print progress through ``log``."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    lock_path = bins_dir() / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:  # one builder at a time: several checkouts may run `make test` at once
        if not _try_lock(lock):
            say(f"waiting for another build to finish (lock {lock_path}) …")
            fcntl.flock(lock, fcntl.LOCK_EX)
        for name in names:
            module = MODULES[name]
            if (_out_dir(module) / ".complete").exists():
                say(f"{', '.join(module.commands)} {module.version()}: cached")
                continue
            _build(module, say)


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _main(names: tuple[str, ...]) -> int:
    """Build ``names``; a real-node module that fails is reported and skipped (its tests then skip, say why, and fail
    with CI=true), the control plane's is fatal."""
    failed = []
    for name in names:
        try:
            ensure_built((name,))
        except BinaryMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            if name not in NODE or os.environ.get("CI", "").lower() == "true":
                return 1
            failed.append(name)
    if failed:
        print(f"warning: {', '.join(failed)} not built: the real node's tests will skip", file=sys.stderr)
    return 0


if __name__ == "__main__":  # `make cluster-bins`: no venv needed
    sys.exit(_main(tuple(sys.argv[1:]) or tuple(MODULES)))
