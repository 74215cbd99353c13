"""The key `make images ENGINE=buildah` caches an image by: everything the build reads, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipefill.devcluster import images
from pipefill.devcluster.images import inputs_hash


def _repo(root: Path) -> Path:
    (root / ".dockerignore").write_text("*\n!pyproject.toml\n!pkg/\n**/__pycache__\n")
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"compiled")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_mod.py").write_text("")
    (root / "Dockerfile").write_text("FROM base\nCOPY . .\n")
    return root


def test_the_key_follows_the_build_context_dockerfile_arguments_and_base(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    args = {"PYTHON_IMAGE": "pipefill.local/python:3.11-bookworm"}
    key = inputs_hash(root, "Dockerfile", args, "sha256:base")
    assert inputs_hash(root, "Dockerfile", args, "sha256:base") == key
    # What the build does not see changes nothing: files .dockerignore leaves out, byte code.
    (root / "tests" / "test_mod.py").write_text("changed")
    (root / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"recompiled")
    assert inputs_hash(root, "Dockerfile", args, "sha256:base") == key
    # What it sees changes the key.
    changed = {
        inputs_hash(root, "Dockerfile", {"PYTHON_IMAGE": "python:3.12.12-slim-bookworm"}, "sha256:base"),
        inputs_hash(root, "Dockerfile", args, "sha256:other-base"),
    }
    (root / "pkg" / "mod.py").write_text("x = 2\n")
    changed.add(inputs_hash(root, "Dockerfile", args, "sha256:base"))
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "Dockerfile").write_text("FROM base\nCOPY . .\nRUN true\n")
    changed.add(inputs_hash(root, "Dockerfile", args, "sha256:base"))
    (root / "Dockerfile").write_text("FROM base\nCOPY . .\n")
    (root / "pkg" / "new.py").write_text("")
    changed.add(inputs_hash(root, "Dockerfile", args, "sha256:base"))
    assert len(changed) == 5 and key not in changed


def test_a_new_archive_replaces_the_same_images_archives_of_other_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each CPU trainer archive is 2.5 GB: those of earlier inputs would fill the disk in a few code changes."""
    cache = tmp_path / "images"
    cache.mkdir()
    for name in ("trainer-0.1.0-aaaa.tar", "trainer-0.1.0-rc1-bbbb.tar", "fill-0.1.0-cccc.tar"):
        (cache / name).write_bytes(b"old")
    pushed: list[str] = []

    def push(*argv: str, quiet: bool = True) -> str:
        assert argv[:2] == ("buildah", "push"), argv
        target = argv[-1].split(":")[1]  # oci-archive:PATH:REF
        Path(target).write_bytes(b"new")
        pushed.append(target)
        return ""

    monkeypatch.setattr(images, "_cache", lambda: cache)
    monkeypatch.setattr(images, "_run", push)
    out = images.archive("ghcr.io/pipefill/trainer:0.1.0", "dddd")
    assert out == cache / "trainer-0.1.0-dddd.tar" and out.read_bytes() == b"new"
    # other tags' and other images' archives stay
    assert sorted(p.name for p in cache.iterdir()) == [
        "fill-0.1.0-cccc.tar",
        "trainer-0.1.0-dddd.tar",
        "trainer-0.1.0-rc1-bbbb.tar",
    ]
    assert images.archive("ghcr.io/pipefill/trainer:0.1.0", "dddd") == out and len(pushed) == 1, "written once"


def test_a_failed_build_removes_its_working_containers_and_the_stale_image_goes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted trainer build left two working containers of 9 GB each; the image of earlier inputs is
    removed before the build, not kept beside the new one."""
    containers = ["theirs"]
    calls: list[tuple[str, ...]] = []

    def run(*argv: str, quiet: bool = True) -> str:
        calls.append(argv)
        if argv[:2] == ("buildah", "containers"):
            return "\n".join(containers)
        if argv[:2] == ("buildah", "bud"):
            containers.extend(["stage-1", "stage-2"])
            raise RuntimeError("`buildah bud --quiet` failed (exit 1)")
        return ""

    monkeypatch.setattr(images, "_run", run)
    monkeypatch.setattr(images, "_inspect", lambda ref, template: "old-inputs" if "Labels" in template else None)
    monkeypatch.setattr(images, "inputs_hash", lambda *args: "new-inputs")
    with pytest.raises(RuntimeError, match="buildah bud"):
        images.build("trainer", "ghcr.io/pipefill/trainer:0.1.0", base="base", torch="cpu", say=lambda _: None)
    assert ("buildah", "rmi", "ghcr.io/pipefill/trainer:0.1.0") in calls
    assert calls[-1] == ("buildah", "rm", "stage-1", "stage-2"), calls
