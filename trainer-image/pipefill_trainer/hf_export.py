"""Export a trained Hugging Face model: the final ``dcp`` checkpoint → a ``save_pretrained`` directory.

Rank 0 builds the whole model on the CPU (the one place the whole model is in memory, once, at the end), reads every
stage's tensors from the checkpoint the ranks saved together (:func:`pipefill_trainer.checkpoint.save_dcp`: the
whole model's names, so no renaming), and writes ``config.json`` and ``model.safetensors`` with transformers' own
``save_pretrained``: the directory loads as ``spec.model.huggingFace`` with ``weights: pretrained``, or with
``from_pretrained``. It is written beside the target and renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from pipefill_trainer.checkpoint import dcp_dir
from pipefill_trainer.hf import HuggingFaceProvider, ModelError

__all__ = ["export_pretrained"]

_PREFIX = "model."  # the model's part of the checkpoint (checkpoint.save_dcp: {"model": ..., "optim": ...})


def export_pretrained(provider: HuggingFaceProvider, *, checkpoints: Path, step: int, out_dir: Path) -> None:
    """Write the weights of the ``dcp`` checkpoint of ``step`` under ``checkpoints`` to ``out_dir``."""
    # imported here, not with the trainer: torch.distributed.checkpoint costs seconds of every start (checkpoint.py)
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    source = dcp_dir(checkpoints, step)
    saved = FileSystemReader(str(source)).read_metadata().state_dict_metadata
    with torch.device("meta"):
        model = provider._skeleton()
    model.to_empty(device=torch.device("cpu"))
    tensors = model.state_dict()  # the model's own tensors: the load fills them in place
    tied = set(provider.tied_keys)  # a head tied to the embedding is that tensor (saved once by a rank holding both)
    missing = [k for k in tensors if _PREFIX + k not in saved and k not in tied]
    if missing:
        raise ModelError(
            f"spec.model.huggingFace.exportPath: the checkpoint {source} lacks {len(missing)} of the model's tensors, "
            f"e.g. {missing[:3]}; it was not saved from this model"
        )
    wanted = {_PREFIX + k: v for k, v in tensors.items() if _PREFIX + k in saved}
    dcp_load(wanted, checkpoint_id=str(source), no_dist=True)
    if tied:
        model.tie_weights()
    model.to(dtype=provider.dtype)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
