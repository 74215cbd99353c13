"""The trainer container of ``spec.trainer``: the user's own command instead of ``python -m pipefill_trainer``.

What it gets beside the variables every trainer gets (:func:`pipefill.pods.rank_containers`):

- the rank environment torchrun gives its workers, one rank per pod: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` 0,
  ``LOCAL_WORLD_SIZE`` 1, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
  and the ``PET_*`` variables torchrun reads as its arguments (``PET_NNODES`` = the world, ``PET_NODE_RANK`` = the
  rank, ``PET_NPROC_PER_NODE`` 1, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``), so ``torchrun …`` without topology
  arguments starts the same worker with the same rank;
- with ``hook``: ``PIPEFILL_HOOK=1``, the fill settings the hook announces with (``PIPEFILL_FILL_MIN_BUBBLE_MS``,
  ``PIPEFILL_FILL_RESERVED_BYTES``) and ``PYTHONPATH`` on the hook: in a pod the ``emptyDir`` an init container of
  the trainer image fills (``python -m pipefill_hook.install``); locally this checkout's (or installation's) hook.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.spec import PipelineTrainingJob, parse_bytes

__all__ = [
    "HOOK_DIR",
    "HOOK_ENV",
    "HOOK_VOLUME",
    "add_hook",
    "command_argv",
    "command_env",
    "hook_init_container",
    "hook_pythonpath",
    "local_argv",
    "local_command_env",
    "trainer_command",
]

HOOK_VOLUME = "pipefill-hook"
HOOK_DIR = "/opt/pipefill-hook"
"""where the init container copies the hook (``boot/`` and ``lib/``), in both containers"""
HOOK_ENV = "PIPEFILL_HOOK"


def command_argv(job: PipelineTrainingJob) -> list[str]:
    t = job.spec.trainer
    assert t is not None
    return [*t.command, *t.args]


def command_env(job: PipelineTrainingJob, rank: int, *, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables of :mod:`this module's docstring <pipefill.usercommand>` for ``rank`` in a pod."""
    t = job.spec.trainer
    assert t is not None
    world = str(job.world_size)
    out = {
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world,
        "PET_NNODES": world,
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
    }
    if t.hook:
        fill = job.spec.fill
        out |= {
            HOOK_ENV: "1",
            "PYTHONPATH": f"{HOOK_DIR}/boot:{HOOK_DIR}/lib",
            env.FILL_MIN_BUBBLE_MS: "" if fill.min_bubble_milliseconds is None else str(fill.min_bubble_milliseconds),
            env.FILL_RESERVED_BYTES: str(parse_bytes(fill.reserved_memory, field="spec.fill.reservedMemory")),
        }
    return out


def trainer_command(
    job: PipelineTrainingJob, rank: int, trainer_env: dict[str, str], *, master_port: int
) -> tuple[str, tuple[str, ...]]:
    """The trainer container's image and command (empty: ``python -m pipefill_trainer``); with ``spec.trainer``
    the user's, and :func:`command_env` added to ``trainer_env``."""
    t = job.spec.trainer
    if t is None:
        return job.spec.trainer_image, ()
    trainer_env |= command_env(job, rank, master_addr=trainer_env["MASTER_ADDR"], master_port=master_port)
    return t.image or job.spec.trainer_image, tuple(command_argv(job))


def add_hook(job: PipelineTrainingJob, pod_spec: dict[str, Any]) -> None:
    """With ``spec.trainer.hook``: the ``emptyDir`` of the hook, mounted read-only into the trainer, and the init
    container that fills it, first of all (before the fill executor's sidecar)."""
    t = job.spec.trainer
    if t is None or not t.hook:
        return
    pod_spec["volumes"].append({"name": HOOK_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}})
    trainer = next(c for c in pod_spec["containers"] if c["name"] == "trainer")
    trainer["volumeMounts"].append({"name": HOOK_VOLUME, "mountPath": HOOK_DIR, "readOnly": True})
    pod_spec["initContainers"] = [hook_init_container(job.spec.trainer_image), *pod_spec.get("initContainers", [])]


def hook_init_container(image: str) -> dict[str, Any]:
    """The init container that copies the hook from our trainer image into the shared ``emptyDir``."""
    return {
        "name": "pipefill-hook",
        "image": image,
        "command": ["python", "-m", "pipefill_hook.install", HOOK_DIR],
        "volumeMounts": [{"name": HOOK_VOLUME, "mountPath": HOOK_DIR}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
    }


def _package_parent(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def local_command_env(job: PipelineTrainingJob, child: dict[str, str], *, master_port: int) -> None:
    """Remap ``child`` (a pod's trainer environment) for a local process: the rendezvous on this machine, the hook
    from where this Python finds it (the checkout's ``trainer-image/``, or the installed package)."""
    child["PET_MASTER_ADDR"], child["PET_MASTER_PORT"] = "127.0.0.1", str(master_port)
    if child.get(HOOK_ENV) != "1":
        return
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    child["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*hook_pythonpath(), *inherited]))


def hook_pythonpath() -> list[str]:
    """A local process's ``PYTHONPATH`` head for the hook: its ``boot/``, then the directories holding
    ``pipefill_hook`` and ``pipefill`` as this Python finds them."""
    hook, core = _package_parent("pipefill_hook"), _package_parent("pipefill")
    if hook is None or core is None:
        raise ValueError(
            "spec.trainer.hook is true but this Python has no pipefill_hook package: install the trainer extra "
            "(pipefill-operator[trainer]) or put the checkout's trainer-image/ on PYTHONPATH, or set hook: false"
        )
    return [str(hook / "boot"), str(hook.parent), str(core.parent)]


def local_argv(argv: list[str]) -> list[str]:
    """The command as a local process: ``python`` is this Python, ``torchrun`` its ``torch.distributed.run``."""
    head, rest = argv[0], argv[1:]
    if head in ("python", "python3"):
        return [sys.executable, *rest]
    if head == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *rest]
    return list(argv)
