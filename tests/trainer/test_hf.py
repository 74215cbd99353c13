"""Hugging Face causal LMs as a model provider, in one process: every supported family's stages, run one after the
other, give transformers' own logits; any cut starts from the same weights; pretrained weights load from a
``save_pretrained`` directory; models the pipeline cannot train are refused with the field, the model type and the fix.
The multi-process gradient equivalence of Llama and Qwen3 under every schedule is in test_grad_equivalence.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from pipefill_trainer.hf import FAMILIES, HuggingFaceProvider, ModelError, read_config
from pipefill_trainer.partition import check_stage_count, measure_parts

COMMON = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}
CONFIGS = {
    "llama-tied": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True),
    "mistral-sliding": lambda: MistralConfig(**COMMON, sliding_window=5, tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=True),
    # sliding-window attention on the layers from 2 on: the stages rebuild a mask per layer type
    "qwen3-sliding": lambda: Qwen3Config(
        **COMMON, head_dim=8, use_sliding_window=True, sliding_window=5, max_window_layers=2, tie_word_embeddings=False
    ),
}
CPU = torch.device("cpu")


def _stages(provider: HuggingFaceProvider, counts: list[int]) -> list[torch.nn.Module]:
    out, start = [], 0
    for s, n in enumerate(counts):
        out.append(
            provider.build_stage(stage_idx=s, num_stages=len(counts), layers=range(start, start + n), device=CPU)
        )
        start += n
    return out


def _run(stages: list[torch.nn.Module], tokens: torch.Tensor) -> torch.Tensor:
    x = tokens
    for stage in stages:
        x = stage(x)
    return x


def _reference(config: Any, stages: list[torch.nn.Module]) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_config(config)
    state: dict[str, torch.Tensor] = {}
    for stage in stages:
        state.update(stage.state_dict())
    model.load_state_dict(state)  # strict: the stages hold exactly the model's tensors
    return model


def test_the_tested_families_are_the_supported_ones() -> None:
    assert sorted({c().model_type for c in CONFIGS.values()}) == sorted(FAMILIES)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stages_one_after_the_other_give_the_models_own_logits_for_any_cut(name: str) -> None:
    torch.set_num_threads(1)
    config = CONFIGS[name]()
    provider = HuggingFaceProvider(config, seq_len=12, seed=3)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    whole = _stages(provider, [4])
    reference = _reference(config, whole)
    with torch.no_grad():
        expected = reference(tokens).logits
        for counts in ([4], [2, 2], [1, 1, 1, 1], [3, 1]):
            stages = _stages(provider, counts)
            torch.testing.assert_close(_run(stages, tokens), expected, rtol=1e-5, atol=1e-6, msg=f"{name} {counts}")
            # any cut initializes every tensor as the whole model does
            merged = {k: v for stage in stages for k, v in stage.state_dict().items()}
            for key, value in whole[0].state_dict().items():
                torch.testing.assert_close(merged[key], value, rtol=0, atol=0, msg=f"{name} {counts} {key}")


def test_a_tied_head_starts_as_the_embedding_and_is_named_as_a_tied_parameter() -> None:
    provider = HuggingFaceProvider(CONFIGS["llama-tied"](), seq_len=12)
    first, last = _stages(provider, [2, 2])
    torch.testing.assert_close(last.get_parameter("lm_head.weight"), first.get_parameter("model.embed_tokens.weight"))
    assert [dict(t.names) for t in provider.tied_parameters(2)] == [
        {0: "model.embed_tokens.weight", 1: "lm_head.weight"}
    ]
    assert provider.tied_parameters(1) == []
    # one stage holds both ends: one tensor, as in the model itself (two copies would train apart)
    (whole,) = _stages(provider, [4])
    assert whole.get_parameter("lm_head.weight") is whole.get_parameter("model.embed_tokens.weight")
    assert "lm_head.weight" not in dict(whole.named_parameters())
    assert HuggingFaceProvider(CONFIGS["qwen3-sliding"](), seq_len=12).tied_parameters(2) == []


def test_pretrained_weights_load_from_a_save_pretrained_directory(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = CONFIGS["llama-tied"]()
    model = AutoModelForCausalLM.from_config(config)
    torch.nn.init.normal_(model.model.norm.weight)  # not the init's ones: these weights must come from the files
    model.save_pretrained(tmp_path)
    provider = HuggingFaceProvider(read_config(tmp_path), seq_len=12, weights_dir=tmp_path, seed=99)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(_run(_stages(provider, [1, 3]), tokens), model(tokens).logits)


def test_bf16_stages_declare_bf16_activations() -> None:
    provider = HuggingFaceProvider(CONFIGS["qwen2"](), seq_len=12, dtype=torch.bfloat16)
    (meta,) = provider.activations(stage_idx=0, num_stages=2, mb_size=3)
    assert (meta.shape, meta.dtype, meta.grad) == ((3, 12, 32), torch.bfloat16, True)
    first = provider.build_stage(stage_idx=0, num_stages=2, layers=range(2), device=CPU)
    assert {p.dtype for p in first.parameters()} == {torch.bfloat16}
    out = first(torch.zeros(3, 12, dtype=torch.long))
    assert (tuple(out.shape), out.dtype) == (meta.shape, meta.dtype)


def test_measured_parts_use_the_providers_stages() -> None:
    torch.set_num_threads(1)
    parts = measure_parts(HuggingFaceProvider(CONFIGS["llama-tied"](), seq_len=12), mb_size=2, device=CPU, repeats=1)
    assert min(*vars(parts.forward).values(), *vars(parts.backward).values()) > 0


def _raises(match: str, make: Any) -> str:
    with pytest.raises(ModelError, match=match) as info:
        make()
    return str(info.value)


def test_models_the_pipeline_cannot_train_are_refused_with_field_model_type_and_fix(tmp_path: Path) -> None:
    from transformers import GPT2Config

    msg = _raises("model type 'gpt2' is not supported", lambda: HuggingFaceProvider(GPT2Config(), seq_len=8))
    assert "spec.model.huggingFace" in msg and "llama" in msg
    no_plan = LlamaConfig(**COMMON)
    no_plan.base_model_pp_plan = None
    msg = _raises("has no pipeline plan", lambda: HuggingFaceProvider(no_plan, seq_len=8))
    assert "'llama' (LlamaForCausalLM)" in msg and "use a model family that defines one" in msg
    _raises(
        "seqLen 64 exceeds .* max_position_embeddings 32",
        lambda: HuggingFaceProvider(LlamaConfig(**COMMON), seq_len=64),
    )
    with pytest.raises(ValueError, match=r"8 stages .* model huggingface:llama has 4; use fewer stages"):
        check_stage_count(HuggingFaceProvider(LlamaConfig(**COMMON), seq_len=8), 8)
    _raises(r"has no config.json; mount", lambda: read_config(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}))
    _raises("trust_remote_code is not supported", lambda: read_config(tmp_path))
    provider = HuggingFaceProvider(LlamaConfig(**COMMON), seq_len=8, weights_dir=tmp_path)
    _raises("holds no \\*.safetensors", lambda: _stages(provider, [4]))
