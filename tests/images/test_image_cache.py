"""The key `make images ENGINE=buildah` caches an image by: everything the build reads, and nothing else."""

from __future__ import annotations

from pathlib import Path

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
