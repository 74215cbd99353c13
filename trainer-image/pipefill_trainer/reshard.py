"""The layout a checkpoint was written with (the layer cut over the stages, the ranks) and resuming onto another.

A ``dcp`` checkpoint (:func:`pipefill_trainer.checkpoint.save_dcp`) holds every tensor under the whole model's
parameter name and the optimizer state flattened per parameter, so any layer cut over any number of stages and
data-parallel replicas can load it: each rank asks for the names its stages hold. A resume onto another layout is
therefore a reshard and costs what a resume costs. Two things do not carry over and are said so in the log: each
rank's RNG states (one rank's stream has no counterpart in a world of another size; the ranks keep the states they
started with, and our models draw nothing at random while training: the data order comes from the seed and the
step), and the bit-exact losses (another cut sums the same terms in another order; the losses agree to float
rounding, the tests hold them within 1e-5).

A ``torch`` checkpoint is one file per rank holding that rank's stage modules: it loads only into the layout it was
written with, and a job of another layout is refused (:func:`refusal`) with the fields to change.

Rank 0 writes the layout beside each checkpoint (``step-NNNNNNNN/layout.json``) before ``latest`` names the step;
a checkpoint written before layouts were recorded has none, and is resumed as it always was.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Layout", "layout_path", "read_layout", "refusal", "saved_cut", "write_layout"]


@dataclass(frozen=True)
class Layout:
    """How the model was laid out over the ranks when a checkpoint was written."""

    layers_per_stage: tuple[int, ...]
    """the layer cut, one entry per stage (stages × virtual stages)"""
    world_size: int
    """ranks: stages × data-parallel replicas"""

    @property
    def num_stages(self) -> int:
        return len(self.layers_per_stage)


def layout_path(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}" / "layout.json"


def write_layout(root: Path, step: int, layout: Layout) -> None:
    """Record ``layout`` for the checkpoint of ``step`` (rank 0, after every rank saved, before ``latest``)."""
    path = layout_path(root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**asdict(layout), "layers_per_stage": list(layout.layers_per_stage)}) + "\n")
    os.replace(tmp, path)


def read_layout(root: Path, step: int) -> Layout | None:
    """The layout of the checkpoint of ``step``; None for one written before layouts were recorded."""
    try:
        raw = json.loads(layout_path(root, step).read_text())
    except FileNotFoundError:
        return None
    return Layout(layers_per_stage=tuple(int(n) for n in raw["layers_per_stage"]), world_size=int(raw["world_size"]))


def saved_cut(root: Path, step: int | None, num_stages: int) -> list[int] | None:
    """The layer cut a job of ``num_stages`` stages keeps from its checkpoints: the cut of the checkpoint of ``step``
    (the one it resumes from) when it has that many stages, else the cut saved at the job's first start
    (``partition.json``, for a checkpoint without a layout) when it has; None when the job cuts anew (no checkpoint,
    or one of another stage count: resharded, or refused by :func:`refusal`)."""
    layout = read_layout(root, step) if step is not None else None
    if layout is not None:
        return list(layout.layers_per_stage) if layout.num_stages == num_stages else None
    saved = root / "partition.json"
    if saved.is_file():
        counts = [int(n) for n in json.loads(saved.read_text())]
        return counts if len(counts) == num_stages else None
    return None


def refusal(saved: Layout, now: Layout, *, checkpoint: Path) -> str | None:
    """Why a job laid out as ``now`` cannot resume from the ``torch``-format checkpoint ``checkpoint`` written as
    ``saved`` (None: the layouts are equal). Names the field that differs, both values and the fixes."""
    if saved == now:
        return None
    if saved.num_stages != now.num_stages:
        what = (
            f"spec.pipeline.stages (× virtualStages): the job has {now.num_stages} stages, the checkpoint was written "
            f"by {saved.num_stages}"
        )
        back = f"set the stages back to {saved.num_stages} stages"
    elif saved.layers_per_stage != now.layers_per_stage:
        what = (
            f"spec.pipeline.layersPerStage: the job cuts the layers {list(now.layers_per_stage)}, the checkpoint "
            f"was written cut {list(saved.layers_per_stage)}"
        )
        back = f"set layersPerStage to {list(saved.layers_per_stage)} (or leave it out: the checkpoint's cut is kept)"
    else:
        what = (
            f"spec.pipeline.dataParallel: the job has {now.world_size} ranks, the checkpoint was written by "
            f"{saved.world_size}"
        )
        back = f"set dataParallel back to make {saved.world_size} ranks"
    return (
        f"{what} ({checkpoint}); a checkpoint of spec.checkpoint.format torch holds each rank's own stages and "
        f"loads only into the layout that wrote it: {back}, or start over in a new spec.checkpoint.path with "
        "format dcp, whose checkpoints reshard onto any stage count"
    )
