"""The Dockerfiles, read as data: multi-stage, pinned, non-root, the pods' commands, the writable paths
docs/operations.md promises, a build context that holds the distribution, and one set of image references."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
import yaml
from dockerfiles import IMAGES, ROOT, Dockerfile, context_files, parse

from pipefill import pods
from pipefill.spec import PipelineTrainingJobSpec
from pipefill.spec.loader import load_training_job

FILES = {name: parse(ROOT / path) for name, path in IMAGES.items()}
DOCS = (ROOT / "docs" / "operations.md").read_text()


def _install_dirs(image: Dockerfile) -> set[str]:
    """Directories the final stage creates with ``install -d``."""
    dirs: set[str] = set()
    for run in image.runs[-1]:
        for command in run.split("&&"):
            words = command.split()
            if words[:2] == ["install", "-d"]:
                dirs.update(w for w in words[2:] if w.startswith("/"))
    return dirs


@pytest.mark.parametrize("name", IMAGES)
def test_each_image_is_multi_stage_pinned_and_runs_as_a_numeric_non_root_user(name: str) -> None:
    image = FILES[name]
    assert len(image.stages) == 2 and image.stages[0].endswith(" AS build")
    assert all(stage.split()[0] == "${PYTHON_IMAGE}" for stage in image.stages)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+", image.args["PYTHON_IMAGE"]), "pin the full version"
    assert image.user == "65532:65532"
    build = " ".join(image.runs[0])
    assert "pip wheel" in build and "--no-build-isolation" in build and "-c requirements/lock.txt setuptools" in build
    # the image's own extra first; the trainer adds huggingface and data (Hugging Face models, Parquet; #23)
    assert re.search(rf'\[{name}(,[a-z]+)*\]"', build), build
    assert "-c requirements/lock.txt" in build.split("/opt/pipefill/bin/pip install")[1]
    assert ("-c requirements/cuda.txt" in build) == (name != "operator")
    assert image.env["PATH"].startswith("/opt/pipefill/bin:")
    assert image.env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_all_three_build_from_the_same_base_image() -> None:
    assert len({image.args["PYTHON_IMAGE"] for image in FILES.values()}) == 1


def test_the_cuda_images_ask_for_the_driver_libraries_nvml_included() -> None:
    for name in ("trainer", "fill"):
        env = FILES[name].env
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # utility: libnvidia-ml (NVML)
        assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0"
        assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin, DRA driver or the pod sets it
    assert not any(k.startswith("NVIDIA_") for k in FILES["operator"].env)


def test_the_images_run_the_commands_the_pods_give_their_containers() -> None:
    job = load_training_job(ROOT / "examples" / "cpu-demo.yaml")
    plans = {plan.name: plan for plan in pods.rank_containers(job, 0)}
    assert FILES["trainer"].cmd == plans["trainer"].argv
    assert FILES["fill"].cmd == plans["fill-executor"].argv
    assert FILES["operator"].cmd == ["python", "-m", "pipefill_operator"]
    assert {image.workdir for image in FILES.values()} == {pods.WORKDIR}


def _documented_mounts() -> set[str]:
    section = DOCS.split("### User and writable paths", 1)[1]
    return set(re.findall(r"^- `(/[^`]*)`$", section, re.MULTILINE))


def _documented_variables() -> list[tuple[str, str, set[str]]]:
    """(variable, value, images) rows of the writable-paths table."""
    rows = re.findall(r"^\| (`\w+`|working directory) \| `(/[^`]*)` \| ([a-z, ]+) \|", DOCS, re.MULTILINE)
    return [(var.strip("`"), value, {i.strip() for i in images.split(",")}) for var, value, images in rows]


def test_writable_paths_are_the_ones_docs_operations_lists() -> None:
    mounts = _documented_mounts()
    assert "/tmp" in mounts and pods.WORKDIR in mounts
    for name, image in FILES.items():
        assert _install_dirs(image) | {"/tmp"} == mounts, name
    rows = _documented_variables()
    assert len(rows) >= 8
    for var, value, images in rows:
        assert any(value == m or value.startswith(m + "/") for m in mounts), f"{var}={value} is on no emptyDir"
        for name in images:
            got = FILES[name].workdir if var == "working directory" else FILES[name].env.get(var)
            assert got == value, f"{name}: {var} is {got}, docs/operations.md says {value}"
    for name, image in FILES.items():  # and no image points a variable at a writable path the table leaves out
        documented = {var for var, _, images in rows if name in images}
        for var, value in image.env.items():
            if any(value == m or value.startswith(m + "/") for m in mounts):
                assert var in documented, f"{name}: {var}={value} is missing from docs/operations.md"


def test_the_build_context_holds_the_distribution_and_nothing_else() -> None:
    sent = {p.relative_to(ROOT).as_posix() for p in context_files()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package, directory in project["tool"]["setuptools"]["package-dir"].items():
        assert f"{directory}/__init__.py" in sent, package
    assert {"pyproject.toml", "README.md", "requirements/lock.txt", "requirements/cuda.txt"} <= sent
    tops = {path.split("/")[0] for path in sent}
    assert tops == {
        "pyproject.toml",
        "README.md",
        "requirements",
        "pipefill",
        "operator",
        "trainer-image",
        "fill-image",
    }
    assert not any("__pycache__" in path or path.endswith("Dockerfile") for path in sent)


def test_image_references_agree_across_spec_chart_makefile_and_repository() -> None:
    app_version = yaml.safe_load((ROOT / "charts" / "pipefill" / "Chart.yaml").read_text())["appVersion"]
    assert app_version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    refs = {name: f"ghcr.io/pipefill/{name}:{app_version}" for name in IMAGES}
    fields = {f.name: f.default for f in PipelineTrainingJobSpec.__dataclass_fields__.values()}
    assert fields["trainer_image"] == refs["trainer"] and fields["fill_image"] == refs["fill"]
    dry = subprocess.run(["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert re.findall(r" -t (\S+) \.$", dry, re.MULTILINE) == list(refs.values())
    assert re.findall(r" -f (\S+) ", dry) == list(IMAGES.values())
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    named = set()
    for rel in files:
        path = ROOT / rel
        if path.is_file() and path.suffix not in {".png", ".npy"}:
            named.update(re.findall(r"ghcr\.io/pipefill/[\w.-]+:[\w.-]+", path.read_text(errors="replace")))
    assert named <= set(refs.values()), f"other image references: {sorted(named - set(refs.values()))}"
    assert all(f"`{ref}`" in DOCS for ref in refs.values())


def test_the_rank_pods_mount_the_images_writable_paths_in_both_containers() -> None:
    """On the read-only root filesystem torch writes its caches on import (TORCHINDUCTOR_CACHE_DIR, under
    /var/cache/pipefill): found by the first real pod (make e2e). /workspace stays the image's (relative outputs go to
    its runs/ scratch mount)."""
    pod = pods.rank_pod(load_training_job(ROOT / "examples" / "cpu-demo.yaml"), 0)
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert _documented_mounts() - {pods.WORKDIR} <= mounted, container["name"]
        assert pods.SCRATCH_DIR in mounted and container["securityContext"]["readOnlyRootFilesystem"] is True
