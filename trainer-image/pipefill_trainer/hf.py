"""Hugging Face causal LMs as a model provider, cut along the model's own pipeline plan.

transformers' decoder configs carry a pipeline plan: ``config.base_model_pp_plan`` names the base model's parts in
order (``embed_tokens``, the ``layers`` list, ``norm``) and the causal-LM class's ``_pp_plan`` the head (``lm_head``).
A stage holds the parts before the layer list on the first stage, its contiguous run of decoder layers, and the parts
after the list and the head on the last stage. What the plan does not give, added here: every stage holds the rotary
embedding (parameter-free), rebuilds the causal mask (per layer type: full or sliding window) and the position ids,
and calls its decoder layers with the keyword arguments the model's own forward passes; tied input and output
embeddings become a :class:`~pipefill_trainer.provider.TiedParameter` (gradients summed between the first and last
stage). Between stages flows one hidden state (B, T, C) in the model's dtype.

Each stage builds the whole model on the ``meta`` device (no memory), keeps its parts and materializes only those:
random init seeds every part by its name in the whole model (so any cut starts from the same weights), pretrained
weights are read from the directory's ``*.safetensors``, only the stage's keys. The stage glue is checked against each
family's own forward (tests/trainer/test_hf.py) for the families in :data:`FAMILIES`; others are refused.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from pipefill_trainer.model import make_deferrable
from pipefill_trainer.provider import LayerCosts, TensorMeta, TiedParameter

__all__ = ["FAMILIES", "HuggingFaceProvider", "ModelError"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""model types whose stages are checked against the model's own forward; transformers 5.23"""

_FIELD = "spec.model.huggingFace"


class ModelError(ValueError):
    """The model cannot be trained on the pipeline; the message names the field, the model type and the fix."""


class HuggingFaceProvider:
    """A causal LM of transformers from its config (and optionally its weights), cut along its pipeline plan.

    ``seq_len``: tokens per sequence (≤ the config's ``max_position_embeddings``). ``dtype``: of weights and
    activations. ``weights_dir``: a directory with ``*.safetensors`` (pretrained); None: random init from ``seed``.
    """

    def __init__(
        self,
        config: Any,
        *,
        seq_len: int,
        dtype: torch.dtype = torch.float32,
        weights_dir: Path | None = None,
        seed: int = 0,
        activation_checkpointing: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.config, self.dtype, self.weights_dir, self.seed = config, dtype, weights_dir, seed
        self.activation_checkpointing = activation_checkpointing
        model_type = getattr(config, "model_type", "?")
        if model_type not in FAMILIES:
            raise ModelError(
                f"{_FIELD}: model type {model_type!r} is not supported: its stages are checked only for "
                f"{', '.join(FAMILIES)} (transformers 5.23); use one of those families or bring the model as user code"
            )
        mapping: Any = AutoModelForCausalLM._model_mapping
        self.cls: Any = mapping[type(config)]
        base_plan = getattr(config, "base_model_pp_plan", None)
        head_plan = getattr(self.cls, "_pp_plan", None)
        if not base_plan or not head_plan:
            raise ModelError(
                f"{_FIELD}: model type {model_type!r} ({self.cls.__name__}) has no pipeline plan "
                "(config.base_model_pp_plan and the class's _pp_plan); use a model family that defines one"
            )
        self.base_plan, self.head_plan = list(base_plan), list(head_plan)
        max_pos = getattr(config, "max_position_embeddings", None)
        if max_pos is not None and seq_len > max_pos:
            raise ModelError(
                f"spec.model.seqLen {seq_len} exceeds the {model_type!r} config's max_position_embeddings {max_pos}; "
                "use a shorter seqLen"
            )
        self._seq_len = seq_len
        self._name = f"huggingface:{model_type}"
        with torch.device("meta"):
            skeleton = self._skeleton()
        base = getattr(skeleton, skeleton.base_model_prefix)
        lists = [k for k in self.base_plan if isinstance(getattr(base, k), nn.ModuleList)]
        if len(lists) != 1:
            raise ModelError(f"{_FIELD}: the pipeline plan of {model_type!r} names {len(lists)} layer lists, not one")
        self.prefix, self.layer_key = skeleton.base_model_prefix, lists[0]
        self.num_layers = len(getattr(base, self.layer_key))
        stray = [n for n, m in base.named_children() if n not in self.base_plan and any(True for _ in m.parameters())]
        if stray:
            raise ModelError(
                f"{_FIELD}: {model_type!r} has parameters outside its pipeline plan ({', '.join(stray)}); "
                "a stage could not hold them once; use a model family whose plan covers every parameter"
            )
        self.tied_keys: dict[str, str] = (
            dict(getattr(skeleton, "_tied_weights_keys", None) or {}) if config.tie_word_embeddings else {}
        )

    # --- the provider interface ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def layers(self) -> int:
        return self.num_layers

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def build_stage(
        self, *, stage_idx: int, num_stages: int, layers: range, device: torch.device, dtype: torch.dtype | None = None
    ) -> nn.Module:
        stage = HFStage(self, stage_idx=stage_idx, num_stages=num_stages, layers=layers)
        stage.materialize(device, dtype or self.dtype)
        return stage

    def activations(self, *, stage_idx: int, num_stages: int, mb_size: int) -> tuple[TensorMeta, ...]:
        return (TensorMeta((mb_size, self._seq_len, int(self.config.hidden_size)), self.dtype),)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1).float(), targets.flatten())  # output: (B, T, V) logits

    def tied_parameters(self, num_stages: int) -> list[TiedParameter]:
        if num_stages < 2:
            return []  # one stage holds both: the model's own tie
        return [
            TiedParameter({self.stage_of(source, num_stages): source, self.stage_of(target, num_stages): target})
            for target, source in self.tied_keys.items()
        ]

    def analytic_costs(self) -> LayerCosts:
        block, head = self._block_flops_per_token(), 2.0 * self.config.hidden_size * self.config.vocab_size
        return LayerCosts(block=block, embed=0.02 * block, head=float(head))

    def flops_per_token(self) -> float:
        head = 2.0 * self.config.hidden_size * self.config.vocab_size
        return float(3.0 * (self.num_layers * self._block_flops_per_token() + head))

    # --- helpers ------------------------------------------------------------------------------------------------
    def _skeleton(self) -> Any:
        """The whole model, on the device of the caller's context (``meta``: no memory)."""
        return self.cls(self.config)

    def _block_flops_per_token(self) -> float:
        c = self.config
        h, heads = c.hidden_size, c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or h // heads
        kv = getattr(c, "num_key_value_heads", None) or heads
        attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q and o, k and v
        mlp = 3 * h * c.intermediate_size  # gate, up, down
        return float(2.0 * (attn + mlp) + 4.0 * self._seq_len * heads * head_dim)

    def stage_of(self, name: str, num_stages: int) -> int:
        """The stage holding the whole model's parameter ``name``: before the layer list the first, after it the last."""
        parts = name.split(".")
        key = parts[1] if parts[0] == self.prefix else parts[0]
        if parts[0] == self.prefix and key in self.base_plan:
            before = self.base_plan.index(key) < self.base_plan.index(self.layer_key)
            return 0 if before else num_stages - 1
        return num_stages - 1  # the head

    def salt(self, name: str) -> int:
        """Seed of one part of the whole model (its name), so every cut initializes it the same."""
        return self.seed * 7919 + zlib.crc32(name.encode())


class HFStage(nn.Module):
    """One stage of a Hugging Face causal LM: the model's own modules under the model's own names."""

    provider: HuggingFaceProvider
    config: Any
    head: list[nn.Module]
    before: list[str]
    after: list[str]
    layer_types: list[str] | None

    def __init__(self, provider: HuggingFaceProvider, *, stage_idx: int, num_stages: int, layers: range) -> None:
        super().__init__()
        self.provider, self.config = provider, provider.config
        self.is_first, self.is_last = stage_idx == 0, stage_idx == num_stages - 1
        with torch.device("meta"):
            skeleton = provider._skeleton()
        base = getattr(skeleton, provider.prefix)
        split = provider.base_plan.index(provider.layer_key)
        for idx, key in enumerate(provider.base_plan):
            if key == provider.layer_key:
                all_layers = getattr(base, key)
                setattr(base, key, nn.ModuleDict({str(i): all_layers[i] for i in layers}))
            elif (idx < split and not self.is_first) or (idx > split and not self.is_last):
                setattr(base, key, None)
        for key in provider.head_plan:
            if not self.is_last:
                setattr(skeleton, key, None)
        self.head = [getattr(skeleton, k) for k in provider.head_plan] if self.is_last else []  # not registered twice
        self.before = [k for k in provider.base_plan[:split] if self.is_first]
        self.after = [k for k in provider.base_plan[split + 1 :] if self.is_last]
        # registered under the whole model's names: model.embed_tokens.weight, model.layers.3.…, lm_head.weight
        setattr(self, provider.prefix, base)
        for key, module in zip(provider.head_plan, self.head, strict=False):
            setattr(self, key, module)
        self._skeleton = [skeleton]  # a list, so it is not a submodule: its live parts are registered above
        self.layer_types = getattr(self.config, "layer_types", None)

    def materialize(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the stage's parts on ``device``, then fill them: pretrained weights or seeded random init."""
        self.to_empty(device=device)
        skeleton, provider = self._skeleton[0], self.provider
        with torch.no_grad():
            for name, module in self._parts_to_init():
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(provider.salt(name))
                    for sub in module.modules():
                        skeleton._init_weights(sub)
            if self.is_last:
                for target, source in provider.tied_keys.items():  # the head's copy starts as the embedding
                    self._init_like(target, source)
        if provider.weights_dir is not None:
            _load_weights(self, provider.weights_dir, tied=provider.tied_keys)
        if self.is_first and self.is_last:
            # one stage holds both ends: the model's own tie, which to_empty undid (it gives every parameter a tensor
            # of its own); two copies would train apart, with no pipeline to sum their gradients
            for target, source in provider.tied_keys.items():
                owner, _, leaf = target.rpartition(".")
                setattr(self.get_submodule(owner), leaf, self.get_parameter(source))
        self.to(dtype=dtype)
        make_deferrable(self)

    @property
    def base(self) -> Any:
        """The base model's module (``model``), holding only this stage's parts."""
        return getattr(self, self.provider.prefix)

    def _parts_to_init(self) -> list[tuple[str, nn.Module]]:
        """The stage's parts by their names in the whole model; each decoder layer is one part."""
        prefix, out = self.provider.prefix, []
        for key, module in self.base.named_children():
            if key == self.provider.layer_key:
                out += [(f"{prefix}.{key}.{i}", layer) for i, layer in module.named_children()]
            elif module is not None:
                out.append((f"{prefix}.{key}", module))
        out += list(zip(self.provider.head_plan, self.head, strict=False))
        return out

    def _init_like(self, target: str, source: str) -> None:
        """Initialize the tied ``target`` (the head's weight) as the first stage initializes ``source`` (the input
        embedding): a fresh embedding, seeded by the source's module name."""
        module_name = source.rpartition(".")[0]
        param = self.get_parameter(target)
        pad = getattr(self.config, "pad_token_id", None)
        with torch.device(param.device):
            fresh = nn.Embedding(param.shape[0], param.shape[1], padding_idx=pad)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.provider.salt(module_name))
            self._skeleton[0]._init_weights(fresh)
        param.copy_(fresh.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, T) on the first stage, else hidden states (B, T, C); returns hidden states or logits (B, T, V)."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        base, key = self.base, self.provider.layer_key
        h = x
        for part in self.before:  # the plan's parts before the layers: the embedding
            h = getattr(base, part)(h)
        position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        mask_args = {"config": self.config, "inputs_embeds": h, "attention_mask": None, "past_key_values": None}
        masks: dict[str, Any] = {"full_attention": create_causal_mask(**mask_args, position_ids=position_ids)}
        if getattr(self.config, "sliding_window", None) is not None:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_args, position_ids=position_ids)
        position_embeddings = base.rotary_emb(h, position_ids)
        for i, layer in getattr(base, key).items():
            kwargs = {
                "attention_mask": masks[self._layer_type(int(i))],
                "position_embeddings": position_embeddings,
                "position_ids": position_ids,
                "past_key_values": None,
                "use_cache": False,
            }
            if self.provider.activation_checkpointing and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False, **kwargs)
            else:
                h = layer(h, **kwargs)
        if not self.is_last:
            return h
        for part in self.after:  # the final norm
            h = getattr(base, part)(h)
        for module in self.head:
            h = module(h)
        return h  # logits (B, T, V)

    def _layer_type(self, layer_idx: int) -> str:
        if self.layer_types is not None:
            return str(self.layer_types[layer_idx])
        return "sliding_attention" if getattr(self.config, "sliding_window", None) is not None else "full_attention"


def _load_weights(stage: nn.Module, weights_dir: Path, *, tied: dict[str, str]) -> None:
    """Copy the stage's tensors from the directory's ``*.safetensors`` (only its keys are read); a tied head missing
    from the files takes the embedding it is tied to."""
    from safetensors import safe_open

    files = sorted(weights_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(
            f"{_FIELD}: pretrained weights were asked for, but {str(weights_dir)!r} holds no *.safetensors; "
            "add the weights or use random init"
        )
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), "pt") as fh:
            where.update(dict.fromkeys(fh.keys(), file))
    wanted = stage.state_dict(keep_vars=True)
    by_file: dict[Path, list[tuple[str, str]]] = {}
    missing = []
    for name in wanted:
        key = name if name in where else tied.get(name, "")
        if key not in where:
            missing.append(name)
            continue
        by_file.setdefault(where[key], []).append((name, key))
    if missing:
        raise ModelError(
            f"{_FIELD}: {str(weights_dir)!r} lacks {len(missing)} tensors of this stage, e.g. {missing[:3]}; "
            "the weights must be the config's model (save_pretrained layout)"
        )
    with torch.no_grad():
        for file, pairs in by_file.items():
            with safe_open(str(file), "pt", device="cpu") as fh:
                for name, key in pairs:
                    tensor, target = fh.get_tensor(key), wanted[name]
                    if tensor.shape != target.shape:
                        raise ModelError(
                            f"{_FIELD}: {key} in {file.name} has shape {list(tensor.shape)}, the config's model "
                            f"{list(target.shape)}; the weights and config.json must belong to the same model"
                        )
                    target.copy_(tensor)


def read_config(path: Path) -> Any:
    """The transformers config of the model directory ``path`` (its ``config.json``); no remote code."""
    from transformers import AutoConfig

    file = path / "config.json"
    if not file.is_file():
        raise ModelError(f"{_FIELD}.path: {str(path)!r} has no config.json; mount the model's directory there")
    raw = json.loads(file.read_text())
    if "auto_map" in raw:
        raise ModelError(
            f"{_FIELD}.path: {file} needs remote code (auto_map); trust_remote_code is not supported, "
            "use a model family built into transformers or bring the model as user code"
        )
    return AutoConfig.from_pretrained(str(path))
