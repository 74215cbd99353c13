"""Build our images without a container daemon (buildah), cached by the hash of their inputs, and load them into the
real node: ``make images ENGINE=buildah`` and ``make images-load``.

The Dockerfiles are the ones ``docker build`` takes, unchanged. Where no registry image can be pulled (this project's
machines reach the package registries only), the base is made here: a Debian bookworm ``minbase`` root from the
machine's Debian mirror (debootstrap) with python3 and venv, committed as ``pipefill.local/python:3.11-bookworm``.
Each image is labelled with the hash of what it is built from (the build context as .dockerignore sends it, the
Dockerfile, the build arguments, the base image's ID): a second build with the same inputs costs the time of one
``buildah inspect``. ``images-load`` writes each image as an OCI archive (kept beside the hash) and imports it into
the node's containerd. docs/cluster.md ("Images on the real node") has the commands and the sizes.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "IMAGES",
    "LOCAL_BASE",
    "TORCH_BUILDS",
    "archive_path",
    "build_args",
    "context_files",
    "inputs_hash",
    "is_built",
    "key_of",
    "main",
]

IMAGES = {"operator": "operator/Dockerfile", "trainer": "trainer-image/Dockerfile", "fill": "fill-image/Dockerfile"}
LOCAL_BASE = "pipefill.local/python:3.11-bookworm"
TORCH_BUILDS = ("cuda", "cpu")
"""the trainer and fill Dockerfiles' ``TORCH`` argument: PyPI's torch with its CUDA wheels, or without them"""
_BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
_LABEL = "io.pipefill.inputs"
# What the build's RUN steps need of the host to reach the package registry as the host does.
_HOST_FILES = ("/etc/ssl/certs", "/etc/pip.conf")


def _repo() -> Path:
    return Path(__file__).resolve().parents[2]


def _cache() -> Path:
    """Beside the binaries' cache: the OCI archives, named by the hash of their inputs."""
    bins = Path(os.environ.get("PIPEFILL_BINS") or Path.home() / ".cache" / "pipefill" / "bins")
    return bins.parent / "images"


def context_files(root: Path) -> list[Path]:
    """The files ``docker build`` sends for ``root`` under its .dockerignore (patterns in order, the last match wins,
    ``!`` re-includes; a pattern matching a directory matches everything below it; ``**/`` any leading directories).
    Excluded directories that no ``!`` pattern reaches into are not walked (``.venv`` holds gigabytes)."""
    rules = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").strip("/")))

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        ancestors = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for include, pattern in rules:
            if any(_match(a, pattern) for a in ancestors):
                verdict = not include
        return verdict

    def reached(rel: str) -> bool:
        return any(include and pattern.startswith(rel + "/") for include, pattern in rules)

    sent = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirnames[:] = sorted(d for d in dirnames if not excluded(prefix + d) or reached(prefix + d))
        sent += [Path(dirpath) / f for f in sorted(filenames) if not excluded(prefix + f)]
    return sent


def _match(rel: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        return any(_match("/".join(rel.split("/")[i:]), pattern[3:]) for i in range(rel.count("/") + 1))
    return rel.count("/") == pattern.count("/") and fnmatch.fnmatchcase(rel, pattern)


def inputs_hash(root: Path, dockerfile: str, build_args: dict[str, str], base_id: str) -> str:
    """The hash of everything an image is built from: equal hashes, equal images (up to the registry's packages,
    which the lock pins)."""
    digest = hashlib.sha256()
    for path in [root / dockerfile, *context_files(root)]:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for key in sorted(build_args):
        digest.update(f"{key}={build_args[key]}\0".encode())
    digest.update(base_id.encode())
    return digest.hexdigest()[:16]


def _run(*argv: str, quiet: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=quiet, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-20:])
        raise RuntimeError(f"`{' '.join(argv[:3])} …` failed (exit {proc.returncode}):\n{tail}")
    return (proc.stdout or "").strip()


def _inspect(ref: str, template: str) -> str | None:
    proc = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", template, ref], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _label(ref: str) -> str | None:
    return _inspect(ref, f'{{{{index .OCIv1.Config.Labels "{_LABEL}"}}}}')


def _mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 sources first), else deb.debian.org."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "debian" in line and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def local_base(say: Callable[[str], None] = _print) -> str:
    """``pipefill.local/python:3.11-bookworm``, made once with debootstrap (about a minute) and reused after."""
    key = hashlib.sha256(f"bookworm minbase {' '.join(_BASE_PACKAGES)}".encode()).hexdigest()[:16]
    if _label(LOCAL_BASE) == key:
        return LOCAL_BASE
    if shutil.which("debootstrap") is None:
        raise RuntimeError("no debootstrap to make the local base image: apt-get install debootstrap")
    started = time.monotonic()
    say(f"making {LOCAL_BASE}: Debian bookworm minbase + {', '.join(_BASE_PACKAGES)} from {_mirror()} …")
    with tempfile.TemporaryDirectory(prefix="pipefill-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        include = ",".join(_BASE_PACKAGES)
        _run("debootstrap", "--variant=minbase", f"--include={include}", "bookworm", str(rootfs), _mirror())
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        container = _run("buildah", "from", "scratch")
        try:
            _run("buildah", "copy", "--quiet", container, f"{rootfs}/", "/")
            path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            _run("buildah", "config", "--env", path, "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
            _run("buildah", "config", "--label", f"{_LABEL}={key}", container)
            _run("buildah", "commit", "--quiet", container, LOCAL_BASE)
        finally:
            _run("buildah", "rm", container)
    say(f"made {LOCAL_BASE} in {time.monotonic() - started:.0f} s")
    return LOCAL_BASE


def build_args(name: str, *, base: str, torch: str) -> dict[str, str]:
    """The Dockerfile's build arguments: the base image, and for the trainer and fill images which torch (``cuda``:
    with PyPI's CUDA wheels; ``cpu``: without them)."""
    if torch not in TORCH_BUILDS:
        raise ValueError(f"--torch {torch!r}: not a torch build; choose one of {', '.join(TORCH_BUILDS)}")
    return {"PYTHON_IMAGE": base} | ({"TORCH": torch} if name != "operator" else {})


def key_of(name: str, *, base: str, torch: str = "cuda") -> str:
    """The hash of image ``name``'s inputs as they are now (``build`` labels the image with it)."""
    base_id = _inspect(base, "{{.FromImageID}}") or base
    return inputs_hash(_repo(), IMAGES[name], build_args(name, base=base, torch=torch), base_id)


def is_built(ref: str, key: str) -> bool:
    """Whether buildah holds ``ref`` built from the inputs ``key``."""
    return _label(ref) == key


def archive_path(ref: str, key: str) -> Path:
    return _cache() / f"{ref.rsplit('/', 1)[-1].replace(':', '-')}-{key}.tar"


def build(name: str, ref: str, *, base: str, torch: str = "cuda", say: Callable[[str], None] = _print) -> str:
    """Build image ``name`` as ``ref`` on ``base`` unless an image with the same inputs is there; returns the hash."""
    root = _repo()
    args = build_args(name, base=base, torch=torch)
    key = key_of(name, base=base, torch=torch)
    if is_built(ref, key):
        say(f"{ref}: cached (inputs {key})")
        return key
    started = time.monotonic()
    if _label(ref) is not None:  # built from other inputs: nothing reuses it, and a CPU trainer holds 4.5 GB
        _run("buildah", "rmi", ref)
        say(f"{ref}: removed the image of other inputs")
    say(f"building {ref} from {IMAGES[name]} on {base} …")
    argv = ["buildah", "bud", "--quiet", "--isolation", "chroot", "--label", f"{_LABEL}={key}"]
    argv += [f"--volume={path}:{path}:ro" for path in _HOST_FILES if Path(path).exists()]
    argv += [f"--build-arg={k}={v}" for k, v in args.items()]
    before = set(_run("buildah", "containers", "--quiet").split())
    try:
        _run(*argv, "-f", str(root / IMAGES[name]), "-t", ref, str(root))
    except BaseException:
        # a failed or interrupted build leaves its stages' working containers behind (9 GB each for the trainer)
        if left := sorted(set(_run("buildah", "containers", "--quiet").split()) - before):
            _run("buildah", "rm", *left)
        raise
    size = _run("buildah", "images", "--noheading", "--format", "{{.Size}}", ref)
    say(f"built {ref} in {time.monotonic() - started:.0f} s ({size})")
    return key


def archive(ref: str, key: str) -> Path:
    """``ref`` as an OCI archive in the cache, named by its inputs' hash (written once)."""
    stem = ref.rsplit("/", 1)[-1].replace(":", "-")
    out = archive_path(ref, key)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(f"{stem}-*.tar"):  # the same image of other inputs (2.5 GB each)
            if stale.stem.removeprefix(f"{stem}-") != key and "-" not in stale.stem.removeprefix(f"{stem}-"):
                stale.unlink()
        tmp = out.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        _run("buildah", "push", "--quiet", ref, f"oci-archive:{tmp}:{ref}")
        tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipefill.devcluster.images", description=__doc__.split("\n")[0])
    parser.add_argument("--registry", default="ghcr.io/pipefill")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--only", default=",".join(IMAGES), help="comma-separated: operator, trainer, fill")
    parser.add_argument("--base", default="", help=f"base image (default: {LOCAL_BASE}, made here)")
    parser.add_argument("--load", type=Path, help="also import into the real node of the cluster in this directory")
    parser.add_argument(
        "--torch",
        choices=TORCH_BUILDS,
        help="the trainer's and fill's torch: cuda (PyPI's CUDA wheels) or cpu (without them); default: cpu with "
        "--load (the real node has no GPU), else cuda",
    )
    args = parser.parse_args(argv)
    torch = args.torch or ("cpu" if args.load else "cuda")
    say = _print
    if shutil.which("buildah") is None:
        say("error: no buildah: apt-get install buildah (Debian's package; no daemon needed)")
        return 2
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if unknown := [n for n in names if n not in IMAGES]:
        say(f"error: --only {','.join(unknown)}: not an image; choose from {', '.join(IMAGES)}")
        return 2
    try:
        base = args.base or local_base(say)
        keys = {n: build(n, f"{args.registry}/{n}:{args.tag}", base=base, torch=torch, say=say) for n in names}
        if args.load:
            from pipefill.devcluster import node

            real = node.running(args.load.resolve())
            if real is None:
                say(f"error: no real node runs in {args.load} (make cluster-node)")
                return 1
            for name, key in keys.items():
                ref = f"{args.registry}/{name}:{args.tag}"
                started = time.monotonic()
                real.import_image(archive(ref, key))
                say(f"{ref} imported into the node in {time.monotonic() - started:.0f} s")
    except RuntimeError as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
