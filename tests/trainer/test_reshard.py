"""Resuming onto another layout, in one process: a dcp checkpoint loads into any layer cut over any number of stages
(a tied head saved under the embedding's name only included), its layout is recorded beside it, and a torch
checkpoint of another layout is refused naming the field, both values and the fix. The same through the trainer's
entry point, with real ranks, is in test_training.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from pipefill_trainer import checkpoint as ckpt
from pipefill_trainer.hf import HuggingFaceProvider
from pipefill_trainer.reshard import Layout, read_layout, refusal, saved_cut, write_layout

CPU = torch.device("cpu")
CONFIG = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
)  # fmt: skip


def _ranks(counts: list[int], *, seed: int) -> list[dict[str, torch.nn.Parameter]]:
    """Each stage of the cut as one rank's parameters under the whole model's names (tied copies made one tensor
    where one rank holds both, as the pipeline does: here a single stage holds them as the model's own tie)."""
    provider = HuggingFaceProvider(CONFIG, seq_len=12, seed=seed)
    out, start = [], 0
    for s, n in enumerate(counts):
        stage = provider.build_stage(stage_idx=s, num_stages=len(counts), layers=range(start, start + n), device=CPU)
        out.append(dict(stage.named_parameters()))
        start += n
    return out


def _optimizer(params: dict[str, torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(list(params.values()), lr=0.01)


def _stepped(params: dict[str, torch.nn.Parameter]) -> torch.optim.Optimizer:
    """An optimizer with state: one step on a gradient that differs per parameter."""
    opt = _optimizer(params)
    for i, p in enumerate(params.values()):
        p.grad = torch.full_like(p, 0.01 * (i + 1))
    opt.step()
    return opt


def _aliases(num_stages: int) -> dict[str, list[str]]:
    ties = HuggingFaceProvider(CONFIG, seq_len=12).tied_parameters(num_stages)
    out: dict[str, list[str]] = {}
    for tie in ties:
        names = list(tie.names.values())
        for name in names:
            out[name] = [n for n in names if n != name]
    return out


def _save(root: Path, counts: list[int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Save the cut ``counts`` (its ranks as one process: the whole model) at step 1; (weights, exp_avg) by name."""
    params = {k: v for rank in _ranks(counts, seed=1) for k, v in rank.items()}
    opt = _stepped(params)
    ckpt.save_dcp(root, step=1, rank=0, model=ckpt.by_name(params), optimizer=opt, extra={})
    weights = {k: v.detach().clone() for k, v in params.items()}
    moments = {k: opt.state[v]["exp_avg"].clone() for k, v in params.items()}
    return weights, moments


@pytest.mark.parametrize(("saved", "loaded"), [([4], [2, 2]), ([4], [1, 1, 1, 1]), ([2, 2], [4]), ([1, 3], [3, 1])])
def test_a_dcp_checkpoint_loads_into_any_cut(tmp_path: Path, saved: list[int], loaded: list[int]) -> None:
    torch.set_num_threads(1)
    weights, moments = _save(tmp_path, saved)
    # one stage holds the tied head as the embedding itself: only the embedding's name is in that checkpoint
    assert ("lm_head.weight" in weights) == (len(saved) > 1)
    embedding = weights["model.embed_tokens.weight"]
    for rank in _ranks(loaded, seed=2):  # other initial weights: what is checked below came from the checkpoint
        opt = _optimizer(rank)
        state = ckpt.load_dcp(
            tmp_path, step=1, rank=None, model=ckpt.by_name(rank), optimizer=opt, map_location=CPU,
            aliases=_aliases(len(loaded)),
        )  # fmt: skip
        assert state == {}  # no rank's RNG states: a resume onto another layout starts them afresh
        for name, param in rank.items():
            want = weights.get(name, embedding if name == "lm_head.weight" else None)
            assert want is not None, name
            torch.testing.assert_close(param.detach(), want, rtol=0, atol=0, msg=name)
            want_avg = moments.get(name, moments["model.embed_tokens.weight"])
            torch.testing.assert_close(opt.state[param]["exp_avg"], want_avg, rtol=0, atol=0, msg=name)
            assert opt.param_groups[0]["lr"] == 0.01


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path: Path) -> None:
    _save(tmp_path, [4])
    params = {"blocks.0.weight": torch.nn.Parameter(torch.zeros(2, 2))}
    with pytest.raises(ValueError, match=r"has no tensor 'blocks.0.weight'.*written by another model"):
        ckpt.load_dcp(
            tmp_path, step=1, rank=None, model=ckpt.by_name(params), optimizer=_optimizer(params), map_location=CPU
        )


def test_the_layout_is_recorded_and_a_resumed_job_keeps_the_cut_of_its_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "step-00000003").mkdir()
    assert read_layout(tmp_path, 3) is None and saved_cut(tmp_path, None, 2) is None
    (tmp_path / "partition.json").write_text("[1, 3]")  # a checkpoint from before layouts: the first start's cut
    assert saved_cut(tmp_path, 3, 2) == [1, 3] and saved_cut(tmp_path, 3, 4) is None
    write_layout(tmp_path, 3, Layout(layers_per_stage=(3, 1), world_size=4))
    assert read_layout(tmp_path, 3) == Layout(layers_per_stage=(3, 1), world_size=4)
    assert json.loads((tmp_path / "step-00000003" / "layout.json").read_text())["layers_per_stage"] == [3, 1]
    assert saved_cut(tmp_path, 3, 2) == [3, 1]  # the checkpoint's own cut, not partition.json's
    assert saved_cut(tmp_path, 3, 4) is None  # another stage count: cut anew (and resharded, or refused)


def test_a_torch_checkpoint_of_another_layout_is_refused_naming_the_field_and_the_fix() -> None:
    saved, root = Layout(layers_per_stage=(2, 2), world_size=2), Path("/ckpt")
    assert refusal(saved, saved, checkpoint=root) is None
    stages = refusal(saved, Layout(layers_per_stage=(1, 1, 1, 1), world_size=4), checkpoint=root)
    assert stages is not None and stages.startswith(
        "spec.pipeline.stages (× virtualStages): the job has 4 stages, the checkpoint was written by 2 (/ckpt); "
        "a checkpoint of spec.checkpoint.format torch holds each rank's own stages"
    )
    assert "set the stages back to 2 stages" in stages and "format dcp, whose checkpoints reshard" in stages
    cut = refusal(saved, Layout(layers_per_stage=(1, 3), world_size=2), checkpoint=root)
    assert cut is not None and cut.startswith("spec.pipeline.layersPerStage: the job cuts the layers [1, 3]")
    replicas = refusal(saved, Layout(layers_per_stage=(2, 2), world_size=4), checkpoint=root)
    assert replicas is not None and replicas.startswith("spec.pipeline.dataParallel: the job has 4 ranks")
