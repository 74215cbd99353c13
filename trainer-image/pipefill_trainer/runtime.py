"""One rank's runtime: from (spec, rank, environment) — a :class:`~pipefill_trainer.config.TrainerConfig` — to its parts.

:func:`build_rank` makes them in the order they depend on each other: the device; the pipeline's shape (schedule,
microbatch size: :func:`pipefill.spec.shape.from_spec`); the model; the peers (live or replayed,
:mod:`pipefill_trainer.peers`) and the topology they give; the layer cut (measured once on rank 0, shared); the
transport; this rank's stages and executor; the optimizer; the data; metrics, the event log and the bubble channel.
The loop (:mod:`pipefill_trainer.train`) only uses them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from pipefill import env
from pipefill.channel import Producer
from pipefill.events import TRAINER_EVENTS, EventWriter
from pipefill.schedules.model import Kind
from pipefill.schedules.validate import p2p_streams
from pipefill.spec.shape import PipelineShape, ShapeError, from_spec
from pipefill_trainer.channel_link import connect_producer
from pipefill_trainer.checkpoint import latest_step
from pipefill_trainer.config import ConfigError, TrainerConfig
from pipefill_trainer.data import TokenSource
from pipefill_trainer.failure import Watchdog
from pipefill_trainer.metrics import TrainerMetrics
from pipefill_trainer.model import GPTConfig
from pipefill_trainer.partition import analytic_costs, check_stage_count, measure_costs, partition_layers
from pipefill_trainer.peers import Peers, open_peers
from pipefill_trainer.pipeline import PipelineRank, Topology
from pipefill_trainer.provider import GPTProvider, ModelProvider
from pipefill_trainer.reshard import saved_cut
from pipefill_trainer.userprovider import load_provider

__all__ = ["RankParts", "build_rank", "checkpoint_root"]


@dataclass
class RankParts:
    """Everything one rank trains with, built by :func:`build_rank`."""

    cfg: TrainerConfig
    device: torch.device
    shape: PipelineShape
    model: ModelProvider
    """the model provider: builds the stages, says what flows between them, the loss"""
    peers: Peers
    topology: Topology
    layer_ranges: list[range]
    pipeline: PipelineRank
    """this rank's stages, its executor (schedule actions over the transport) and the gradient reductions"""
    optimizer: torch.optim.Optimizer
    data: TokenSource
    metrics: TrainerMetrics
    events: EventWriter
    producer: Producer | None
    """the bubble channel's producer; None when the fill is disabled (bubbles measured, never announced)"""
    watchdog: Watchdog
    checkpoint_format: str = "torch"
    """``spec.checkpoint.format`` resolved: ``dcp`` for a Hugging Face model unless the spec says otherwise"""

    def log(self, text: str) -> None:
        prefix = "[replay] " if self.peers.replay else ""
        print(f"{prefix}rank {self.cfg.rank}: {text}", flush=True)

    def close(self) -> None:
        self.events.close()
        if self.producer is not None:
            self.producer.close()


def checkpoint_root(cfg: TrainerConfig) -> Path:
    return Path(cfg.job.spec.checkpoint.path)


def _model_provider(cfg: TrainerConfig) -> ModelProvider:
    """``spec.model.huggingFace``'s causal LM, else our GPT decoder from ``spec.model``."""
    spec = cfg.job.spec
    if spec.model.hugging_face is not None:
        return _hugging_face(cfg)
    if spec.model.python is not None:
        code_dir = os.environ.get(env.MODEL_CODE_DIR)
        return load_provider(
            spec.model.python.function,
            code_dir=Path(code_dir) if code_dir else None,
            seq_len=spec.model.seq_len,
            seed=spec.data.seed,
        )
    layers, hidden, heads = spec.model.dims()
    gpt = GPTConfig(
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=spec.model.seq_len,
        vocab_size=spec.model.vocab_size,
        tied_embeddings=spec.model.tied_embeddings,
        activation_checkpointing=spec.pipeline.activation_checkpointing,
        seed=spec.data.seed,
    )
    return GPTProvider(gpt)


def _hugging_face(cfg: TrainerConfig) -> ModelProvider:
    spec = cfg.job.spec
    hf = spec.model.hugging_face
    assert hf is not None
    try:
        from pipefill_trainer.hf import HuggingFaceProvider, read_config
    except ImportError as exc:  # transformers is the huggingface extra
        raise ConfigError(
            f"spec.model.huggingFace needs transformers ({exc}); use the trainer image, or install "
            "pipefill-operator[trainer,huggingface]"
        ) from None
    path = Path(hf.path)
    try:
        return HuggingFaceProvider(
            read_config(path),
            seq_len=spec.model.seq_len,
            dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[str(hf.dtype)],
            weights_dir=path if str(hf.weights) == "pretrained" else None,
            seed=spec.data.seed,
            activation_checkpointing=spec.pipeline.activation_checkpointing,
        )
    except ValueError as exc:  # ModelError, or transformers refusing the config
        raise ConfigError(str(exc)) from None


def _data(cfg: TrainerConfig, model: ModelProvider, shape: PipelineShape) -> TokenSource:
    """The rank's data; a file that is missing or does not fit the model is a permanent error (exit 2)."""
    try:
        return TokenSource(
            cfg.job.spec.data,
            vocab_size=model.vocab_size,
            seq_len=model.seq_len,
            replica_batch=shape.replica_batch,
            replicas=shape.data_parallel,
            tokenizer=_tokenizer(cfg),
        )
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from None


def _tokenizer(cfg: TrainerConfig) -> Path | None:
    """The tokenizer.json of ``source: jsonl``: spec.data.tokenizer, else the Hugging Face model's own."""
    spec = cfg.job.spec
    if spec.data.tokenizer:
        return Path(spec.data.tokenizer)
    if spec.model.hugging_face is not None:
        return Path(spec.model.hugging_face.path) / "tokenizer.json"
    return None


def _checkpoint_format(cfg: TrainerConfig) -> str:
    spec = cfg.job.spec
    if spec.checkpoint.format is not None:
        return str(spec.checkpoint.format)
    return "dcp" if spec.model.hugging_face is not None else "torch"


def _comm_timeout(cfg: TrainerConfig) -> timedelta:
    return timedelta(seconds=cfg.comm_timeout_s)


def _layer_cut(
    cfg: TrainerConfig, model: ModelProvider, shape: PipelineShape, peers: Peers, device: torch.device
) -> list[range]:
    """Explicit layersPerStage, else the cut of the checkpoint the job resumes from when it has as many stages (a
    resumed job keeps its cut), else balanced by costs measured once on rank 0 and shared, so every rank cuts the
    model the same way."""
    n, explicit = shape.schedule.num_stages, cfg.job.spec.pipeline.layers_per_stage
    try:
        check_stage_count(model, n)
        if explicit is not None:  # a Hugging Face model's layers are first known here
            return partition_layers(model.layers, n, costs=analytic_costs(model), layers_per_stage=explicit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    root = checkpoint_root(cfg)
    saved = root / "partition.json"

    def measured() -> list[int]:
        kept = saved_cut(root, latest_step(root), n)
        if kept is not None:
            return kept
        # no checkpoint, or one of another stage count: a dcp checkpoint is resharded onto this cut, a torch one
        # refused at resume (reshard.py)
        costs = measure_costs(model, mb_size=shape.microbatch_size, device=device)
        counts = [len(r) for r in partition_layers(model.layers, n, costs=costs)]
        if peers.writes_job_state:
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(counts))
        return counts

    return partition_layers(model.layers, n, costs=analytic_costs(model), layers_per_stage=peers.share(measured))


def _optimizer(cfg: TrainerConfig, pipeline: PipelineRank) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and norms (parameters of fewer than 2 dimensions)."""
    opt, params = cfg.job.spec.optimizer, pipeline.parameters()
    groups: list[dict[str, Any]] = [
        {"params": [p for p in params if p.dim() >= 2]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=opt.learning_rate, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay)


def build_rank(cfg: TrainerConfig, *, registry: CollectorRegistry | None = None) -> RankParts:
    """The rank's parts; collective with the other ranks (process groups, the layer cut, the transport)."""
    if cfg.cpu_affinity:
        os.sched_setaffinity(0, cfg.cpu_affinity)
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core plays one GPU; more threads only contend on small machines
    else:
        torch.cuda.set_device(device)
    try:
        shape = from_spec(cfg.job, schedule_csv=cfg.schedule_csv)
    except ShapeError as exc:  # admission checked all but a custom schedule's CSV
        raise ConfigError(str(exc)) from None
    model = _model_provider(cfg)
    peers = open_peers(cfg, device, model=model, microbatch_size=shape.microbatch_size)
    topology = peers.topology(cfg.rank, stages=shape.stages, data_parallel=shape.data_parallel)
    layer_ranges = _layer_cut(cfg, model, shape, peers, device)
    pipeline = PipelineRank(
        provider=model,
        schedule=shape.schedule,
        topo=topology,
        layer_ranges=layer_ranges,
        mb_size=shape.microbatch_size,
        device=device,
        transport=peers.open_transport(shape.schedule, topology),
        autocast_dtype=torch.bfloat16 if device.type == "cuda" else None,
        distributed=peers.collectives,
        timeout=_comm_timeout(cfg),
    )
    registry = registry if registry is not None else CollectorRegistry()
    metrics = TrainerMetrics(registry, device_index=device.index or 0 if device.type == "cuda" else None)
    TrainerMetrics.serve(cfg.metrics_port, registry)
    parts = RankParts(
        cfg=cfg,
        device=device,
        shape=shape,
        model=model,
        peers=peers,
        topology=topology,
        layer_ranges=layer_ranges,
        pipeline=pipeline,
        optimizer=_optimizer(cfg, pipeline),
        data=_data(cfg, model, shape),
        metrics=metrics,
        events=EventWriter(cfg.out_dir / TRAINER_EVENTS if cfg.out_dir else None, flush_each=False),
        producer=connect_producer(
            cfg, device=device, stage_idx=pipeline.stage_ids[0], num_stages=shape.schedule.num_stages
        ),
        watchdog=Watchdog(timeout_s=cfg.comm_timeout_s + 30, rank=cfg.rank),
        checkpoint_format=_checkpoint_format(cfg),
    )
    if any(a.kind == Kind.W for a in pipeline.executor.actions) and (late := pipeline.undeferred()):
        shown = ", ".join(late[:6]) + (f" and {len(late) - 6} more" if len(late) > 6 else "")
        parts.log(f"zero-bubble split: I computes the weight gradients of {shown} (not nn.Linear); W the rest")
    for st in p2p_streams(shape.schedule):
        if st.reordered and st.dst_rank == topology.pp_rank:
            parts.log(f"{st}: consumed in microbatch order {st.recv_order}, posted in send order {st.send_order}")
    return parts
