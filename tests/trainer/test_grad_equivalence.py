"""Every schedule, on 2 and 4 gloo ranks (and data parallel × pipeline): one step's loss and every parameter's
gradient equal a single-process reference of the same model and batch.

Our transport uses one constant tag, so gloo matches each process group's messages in posting order, as NCCL does:
these runs hold under NCCL's matching rule. The control: the same executor on one process group per world (the
design before issue #5) delivers zbv's tensors to the wrong actions and its gradients come out wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _grad_common import batch, model_config
from trainer_procs import HERE, launch, wait_all

from pipefill_trainer.model import StageModule

pytestmark = pytest.mark.slow

CUSTOM_2 = "0F0,0F1,0B0,0I1,0W1\n1F0,1I0,1F1,1B1,1W0\n"
# rank 1 consumes microbatch 1 first, rank 0 sends 0 first (and back): receives are posted in the sender's order
CUSTOM_REORDERED = "0F0,0F1,0B0,0B1\n1F1,1B1,1F0,1B0\n"
CUSTOM_4 = "".join(f"{r}F0,{r}F1,{r}I1,{r}I0,{r}W0,{r}W1\n" for r in range(4))

CONFIGS: dict[int, list[dict[str, Any]]] = {
    2: [
        {"id": "gpipe", "schedule": "gpipe", "stages": 2, "m": 4, "mb": 2},
        {"id": "1f1b-tied", "schedule": "1f1b", "stages": 2, "m": 4, "mb": 2, "tied": True},
        {"id": "interleaved", "schedule": "interleaved-1f1b", "stages": 2, "v": 2, "m": 4, "mb": 2},
        {"id": "zbh1", "schedule": "zero-bubble-h1", "stages": 2, "v": 2, "m": 4, "mb": 2, "ckpt": True},
        {"id": "zbv-tied", "schedule": "zbv", "stages": 2, "v": 2, "m": 4, "mb": 2, "tied": True},
        {"id": "custom", "schedule": "custom", "stages": 2, "m": 2, "mb": 2, "csv": CUSTOM_2, "layers": 4},
        {"id": "custom-reordered", "schedule": "custom", "stages": 2, "m": 2, "mb": 2, "csv": CUSTOM_REORDERED},
    ],
    4: [
        {"id": "gpipe", "schedule": "gpipe", "stages": 4, "m": 4, "mb": 1},
        {"id": "1f1b", "schedule": "1f1b", "stages": 4, "m": 4, "mb": 1, "tied": True},
        {"id": "interleaved", "schedule": "interleaved-1f1b", "stages": 4, "v": 2, "m": 4, "mb": 1},
        {"id": "zbh1", "schedule": "zero-bubble-h1", "stages": 4, "v": 2, "m": 4, "mb": 1},
        {"id": "zbv", "schedule": "zbv", "stages": 4, "v": 2, "m": 4, "mb": 1},
        {"id": "custom", "schedule": "custom", "stages": 4, "m": 2, "mb": 1, "csv": CUSTOM_4, "layers": 4},
        {"id": "dp2-1f1b-tied", "schedule": "1f1b", "stages": 2, "dp": 2, "m": 2, "mb": 2, "tied": True},
        {"id": "dp2-zbv", "schedule": "zbv", "stages": 2, "dp": 2, "v": 2, "m": 4, "mb": 1},
    ],
}


# run in the world-2 launch after the others; expected to come out wrong
ONE_GROUP = {"id": "zbv-one-group", "schedule": "zbv", "stages": 2, "v": 2, "m": 4, "mb": 2, "transport": "one-group"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """Directory of the results of ``world`` processes running ``CONFIGS[world]`` (each world launched once)."""
    done: dict[int, Path] = {}

    def run(world: int) -> Path:
        if world not in done:
            out = tmp_path_factory.mktemp(f"world{world}")
            configs = CONFIGS[world] + ([ONE_GROUP] if world == 2 else [])
            (out / "configs.json").write_text(json.dumps(configs))
            procs = launch([str(HERE / "_grad_worker.py"), str(out / "configs.json"), str(out)], world=world)
            for rank, (code, output) in enumerate(wait_all(procs, timeout_s=100)):
                assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
            done[world] = out
        return done[world]

    return run


def _reference(c: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    cfg = model_config(c)
    model = StageModule(cfg, stage_idx=0, num_stages=1, layers=range(cfg.layers))
    dp, total = c.get("dp", 1), 0.0
    for d in range(dp):
        tokens, targets = batch(c, dp_rank=d)
        for x, y in zip(tokens, targets, strict=True):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / (c["m"] * dp)
            loss.backward()
            total += float(loss.detach())
    return total, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_matches_single_process_reference(world: int, runs: Callable[[int], Path]) -> None:
    torch.set_num_threads(1)
    tmp_path = runs(world)
    for c in CONFIGS[world]:
        ref_loss, ref_grads = _reference(c)
        seen: set[str] = set()
        loss = 0.0
        for rank in range(world):
            got = torch.load(tmp_path / f"{c['id']}-rank{rank}.pt")
            assert not got["missing"], f"{c['id']} rank {rank}: no gradient for {got['missing']}"
            if got["last"]:
                loss += got["loss"] / c.get("dp", 1)
            for name, grad in got["grads"].items():
                torch.testing.assert_close(
                    grad, ref_grads[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name, i=c["id"]: f"{i} {n}: {m}"
                )
                seen.add(name)
        assert seen == set(ref_grads), f"{c['id']}: parameters not covered {set(ref_grads) - seen}"
        assert loss == pytest.approx(ref_loss, rel=1e-6), c["id"]


def test_one_process_group_for_all_streams_mismatches_zbv(runs: Callable[[int], Path]) -> None:
    torch.set_num_threads(1)
    out = runs(2)
    _, ref_grads = _reference(ONE_GROUP)
    wrong = []
    for rank in range(2):
        got = torch.load(out / f"{ONE_GROUP['id']}-rank{rank}.pt")
        if "error" in got:
            wrong.append(f"rank {rank}: {got['error']}")
            continue
        wrong += [name for name, grad in got["grads"].items() if not torch.allclose(grad, ref_grads[name], rtol=1e-3)]
    assert wrong, "zbv on one process group with one tag gave the reference gradients; the control shows nothing"
