"""Checkpoints, written atomically, and the job-wide pointer to the newest complete one.

Layout under ``spec.checkpoint.path``, format ``torch``::

    step-00000020/rank-00000.pt   # one file per rank: write to a temporary name, fsync, rename
    step-00000020/layout.json     # the layer cut and ranks that wrote it (rank 0; pipefill_trainer.reshard)
    latest                        # "20": written (atomically) by rank 0 after every rank saved step 20

Format ``dcp`` (:func:`save_dcp`): ``step-00000020/dcp/`` is one ``torch.distributed.checkpoint`` of the whole
model, saved by every rank together: each stage's tensors under the whole model's names (stages never collide; data
parallel replicas and tied copies are saved once) and the optimizer state flattened per parameter
(``flatten_optimizer_state_dict``: the stages' ``param_groups.0`` would otherwise collide and a stage resume with
another stage's group); ``step-00000020/rank-00000.extra.pt`` keeps each rank's RNG states. Any layer cut over
any number of ranks loads it (:func:`load_dcp`; :mod:`pipefill_trainer.reshard`).

A rank killed mid-write leaves only a temporary file; ``latest`` names only steps every rank finished, so resume
never mixes steps. The state holds the step, the stages' weights, the optimizer, and the RNG states; the data position
is the step (see data.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "by_name",
    "dcp_dir",
    "is_dcp",
    "latest_step",
    "load_dcp",
    "load_rank",
    "rng_state",
    "save_dcp",
    "save_rank",
    "set_rng_state",
    "write_latest",
]


def _dcp_options() -> Any:
    """torch.distributed.checkpoint is imported where a ``dcp`` checkpoint is read or written, not with this module:
    it pulls in DTensor and symbolic shapes, 1–2.5 s of every trainer start measured here, which a job on ``torch``
    checkpoints (our GPT's default) never needs."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _rank_path(root: Path, step: int, rank: int) -> Path:
    return root / f"step-{step:08d}" / f"rank-{rank:05d}.pt"


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_rank(root: Path, *, step: int, rank: int, state: dict[str, Any]) -> Path:
    path = _rank_path(root, step, rank)
    _atomic_write(path, lambda fh: torch.save({"step": step, **state}, fh))
    return path


def write_latest(root: Path, step: int) -> None:
    """Mark ``step`` complete; call after every rank saved it (after a barrier)."""
    _atomic_write(root / "latest", lambda fh: fh.write(f"{step}\n".encode()))


def latest_step(root: Path) -> int | None:
    try:
        text = (root / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise ValueError(f"{root / 'latest'} holds {text!r}, not a step number; remove it to start over")
    return int(text)


def load_rank(root: Path, *, step: int, rank: int, map_location: torch.device) -> dict[str, Any]:
    return _load_file(root, step, _rank_path(root, step, rank), map_location)


def _load_file(root: Path, step: int, path: Path, map_location: torch.device) -> dict[str, Any]:
    """A rank's file of the step ``latest`` names."""
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path} is missing though {root / 'latest'} names step {step}; the job's ranks changed? "
            "start with the same stages × dataParallel, or remove the checkpoint directory"
        )
    state: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=False)
    return state


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def by_name(params: dict[str, nn.Parameter]) -> nn.Module:
    """One module holding ``params`` (the same tensors) under their dotted names: a rank's stages as one model whose
    names are the whole model's, as ``torch.distributed.checkpoint.state_dict`` wants one model per rank."""
    root = nn.Module()
    for name, param in params.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if part not in node._modules:
                node.add_module(part, nn.Module())
            child = node._modules[part]
            assert child is not None
            node = child
        node.register_parameter(leaf, param)
    return root


def dcp_dir(root: Path, step: int) -> Path:
    """The ``dcp`` checkpoint of ``step``."""
    return root / f"step-{step:08d}" / "dcp"


def _extra_path(root: Path, step: int, rank: int) -> Path:
    return root / f"step-{step:08d}" / f"rank-{rank:05d}.extra.pt"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without the warnings torch gives about what is intended here: a replayed rank (no process group) saving and
    loading alone (``no_dist``), and a save overwriting the step directory a killed save left."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint", category=UserWarning)
        yield


def is_dcp(root: Path, step: int) -> bool:
    """Whether step ``step`` was saved in the ``dcp`` format."""
    return (dcp_dir(root, step) / ".metadata").is_file()


def _dcp_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        "model": get_model_state_dict(model, options=_dcp_options()),
        "optim": get_optimizer_state_dict(model, optimizer, options=_dcp_options()),
    }


def save_dcp(
    root: Path, *, step: int, rank: int, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any]
) -> None:
    """Save the job's weights and optimizer state with every rank (collective), and this rank's ``extra`` beside."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    # a step directory that ``latest`` does not name is one a killed save left: overwrite it
    writer = FileSystemWriter(dcp_dir(root, step), overwrite=True)
    with _quiet():
        dcp_save(_dcp_state(model, optimizer), storage_writer=writer, no_dist=not dist.is_initialized())
    _atomic_write(_extra_path(root, step, rank), lambda fh: torch.save({"step": step, **extra}, fh))


def _stored_keys(path: Path) -> set[str]:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return set(FileSystemReader(path).read_metadata().state_dict_metadata)


def _renamed(key: str, renames: Mapping[str, str]) -> str:
    """``key`` of the flattened state (``model.<name>``, ``optim.state.<name>.<leaf>``,
    ``optim.param_groups.<name>.<leaf>``) with its parameter name replaced as ``renames`` says."""
    for prefix in ("model.", "optim.state.", "optim.param_groups."):
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            name, leaf = (rest, "") if prefix == "model." else (rest.rsplit(".", 1)[0], "." + rest.rsplit(".", 1)[1])
            return f"{prefix}{renames.get(name, name)}{leaf}"
    return key


def load_dcp(
    root: Path,
    *,
    step: int,
    rank: int | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    map_location: torch.device,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Load this rank's tensors and optimizer state in place (collective); returns the ``extra`` that rank ``rank``
    saved (None: none, for a resume onto another layout, where no rank's extra is this one's: :mod:`reshard`).

    Any layer cut loads it: each tensor is asked for by the whole model's name. A tied parameter may have been saved
    under another holder's name only (a Hugging Face head tied to the embedding is one tensor, the embedding's, where
    one stage held both); ``aliases`` (name → the other names of its tie) lets this rank load it from there. The
    optimizer's state is created before loading (``get_optimizer_state_dict`` does), so the flattened keys have a
    place to go."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    path = dcp_dir(root, step)
    state = _dcp_state(model, optimizer)
    stored, renames = _stored_keys(path), {}
    for name in state["model"]:
        if f"model.{name}" not in stored:
            found = [a for a in (aliases or {}).get(name, ()) if f"model.{a}" in stored]
            if not found:
                raise ValueError(
                    f"the checkpoint {path} has no tensor {name!r}, which this rank's stages hold: it was written by "
                    "another model; point spec.checkpoint.path elsewhere to start over"
                )
            renames[name] = found[0]
    # one flat request under the stored keys: dcp loads tensors in place and replaces the other values in it
    flat = {f"{top}.{key}": value for top, part in state.items() for key, value in part.items()}
    request = {_renamed(key, renames): value for key, value in flat.items()}
    with _quiet():
        dcp_load(request, checkpoint_id=path, no_dist=not dist.is_initialized())
    for key in flat:
        top, _, rest = key.partition(".")
        state[top][rest] = request[_renamed(key, renames)]
    set_model_state_dict(model, state["model"], options=_dcp_options())
    set_optimizer_state_dict(model, optimizer, state["optim"], options=_dcp_options())
    if rank is None:
        return {}
    return _load_file(root, step, _extra_path(root, step, rank), map_location)
