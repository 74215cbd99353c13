"""Predict a pipeline training job's bubbles from its schedule and action costs, and the fill capacity they offer.

Input: a PipelineTrainingJob manifest (-f) or flags; flags override the manifest. Costs: uniform (F = I = W = 1
time unit, B = 2, free communication: for checking formulas), analytic (6·N·T flops on a device of given TFLOP/s;
the default with a manifest or --params), or profile (the JSON the trainer writes; the default with --profile).
Output: a table per rank (bubbles by kind, their durations and free memory), or --json, or --order; --trace and
--plot write a Chrome/Perfetto trace and a picture of the timeline.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipefill.schedules import (
    FILL_STEPS,
    SCHEDULE_NAMES,
    Costs,
    FillProfile,
    FillProjection,
    MemoryModel,
    Timeline,
    canonical_name,
    project_fill,
    simulate,
)
from pipefill.schedules.report import format_report
from pipefill.schedules.trace import chrome_trace
from pipefill.spec import PipelineTrainingJob, load_training_job
from pipefill.spec.shape import PipelineShape, ShapeNames, derive_shape, from_spec

__all__ = ["add_arguments", "run"]

_GIB = 1 << 30
_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def _count(text: str) -> float:
    """``40e9``, ``40B``, ``1.3B``, ``350M``."""
    t = text.strip().upper()
    try:
        return float(t[:-1]) * _SUFFIX[t[-1]] if t and t[-1] in _SUFFIX else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count like 40e9, 40B or 350M") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("the job")
    src.add_argument("-f", "--manifest", metavar="MANIFEST", help="PipelineTrainingJob manifest (YAML)")
    src.add_argument("--schedule", help=f"one of {', '.join(SCHEDULE_NAMES)} (default 1f1b)")
    src.add_argument("--stages", type=int, help="pipeline ranks p (each holds --virtual-stages model stages)")
    src.add_argument("--microbatches", type=int, help="microbatches m per step (default: global batch ÷ (dp × mbs))")
    src.add_argument("--virtual-stages", type=int, help="stages per rank v (default 1; zbv: 2)")
    src.add_argument("--schedule-csv", metavar="FILE", help="schedule custom: torch's compute-only CSV")
    model = parser.add_argument_group("analytic cost model")
    model.add_argument("--costs", choices=("uniform", "analytic", "profile"), help="cost source (see above)")
    model.add_argument("--params", type=_count, help="model parameters N (e.g. 40B); default: from layers × width")
    model.add_argument("--layers", type=int, help="decoder layers")
    model.add_argument("--hidden-size", type=int, help="model width")
    model.add_argument("--vocab-size", type=int, help="vocabulary (for the parameter count; default 50304)")
    model.add_argument("--seq-len", type=int, help="tokens per sample (default 2048)")
    model.add_argument("--microbatch-size", type=int, help="samples per microbatch (default: from global batch, or 1)")
    model.add_argument("--global-batch", type=int, help="samples per step over all replicas")
    model.add_argument("--data-parallel", type=int, help="pipeline replicas (default 1)")
    model.add_argument("--tensor-parallel", type=int, default=1, help="devices per stage (default 1)")
    model.add_argument("--device-tflops", type=float, default=989.0, help="peak dense TFLOP/s (default 989, H100)")
    model.add_argument("--mfu", type=float, default=0.45, help="fraction of peak reached (default 0.45)")
    model.add_argument("--device-memory-gib", type=float, default=80.0, help="device memory, GiB (default 80)")
    model.add_argument("--reserve-gib", type=float, default=2.0, help="memory never offered to fill, GiB (default 2)")
    model.add_argument("--p2p-gbps", type=float, default=50.0, help="P2P bandwidth between ranks, GB/s (default 50)")
    model.add_argument("--p2p-latency-us", type=float, default=20.0, help="P2P latency, µs (default 20)")
    model.add_argument("--dp-gbps", type=float, default=50.0, help="all-reduce bus bandwidth, GB/s (default 50)")
    model.add_argument("--activation-checkpointing", action="store_true", default=None, help="keep stage inputs only")
    model.add_argument("--profile", metavar="FILE", help="measured profile JSON (docs/schedules.md)")
    out = parser.add_argument_group("output")
    out.add_argument(
        "--fill-profile",
        metavar="FILE",
        help="fill workload JSON: time, memory and pieces per batch size, or the fill executor's cached profile",
    )
    out.add_argument(
        "--fill-steps",
        choices=FILL_STEPS,
        help="fill in whole steps planned per bubble, or in pieces carried between bubbles (default: pieces where "
        "the profile has them)",
    )
    out.add_argument("--fill-guard-ms", type=float, help="the fill's guard before a bubble's end (default: profile's)")
    out.add_argument("--fill-switch-ms", type=float, help="the fill's wake-up per bubble (default: profile's)")
    mode = out.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print the whole result as JSON")
    mode.add_argument("--order", action="store_true", help='print each rank\'s action order as {"ranks": {...}}')
    out.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the timeline")
    out.add_argument("--plot", metavar="FILE", help="draw the timeline (PNG; needs matplotlib)")


FLAG_NAMES = ShapeNames(
    schedule="--schedule",
    stages="--stages",
    microbatches="--microbatches",
    virtual_stages="--virtual-stages",
    global_batch="--global-batch",
    data_parallel="--data-parallel",
    microbatch_size="--microbatch-size",
    custom_schedule="--schedule-csv",
)
"""How errors name the shape's inputs when flags give (or override) them."""
_SHAPE_FLAGS = (
    "schedule",
    "stages",
    "microbatches",
    "virtual_stages",
    "global_batch",
    "data_parallel",
    "microbatch_size",
)


@dataclass(frozen=True)
class _Model:
    """What the analytic cost and memory models need beyond the pipeline's shape (manifest, then flags)."""

    layers: int | None
    hidden_size: int | None
    params: float | None
    vocab_size: int
    seq_len: int
    tied: bool
    activation_checkpointing: bool


def run(args: argparse.Namespace) -> int:
    try:
        job = load_training_job(args.manifest) if args.manifest else None
        shape = _shape(args, job)
        if args.order:
            print(json.dumps({"ranks": shape.schedule.order_dict()}))
            return 0
        costs, memory, source = _costs(args, _model(args, job), shape)
        timeline = simulate(shape.schedule, costs, memory, validate=False)  # the shape's schedule is validated
        fill = _fill(args, timeline)
    except (ValueError, OSError) as exc:
        print(f"pipefill simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        result: dict[str, Any] = {"costs": source, **timeline.to_dict()}
        result["fill"] = fill.to_dict() if fill is not None else None
        print(json.dumps(result))
    else:
        print(format_report(timeline, fill, units="units" if source == "uniform" else "s"))
    if args.trace:
        Path(args.trace).write_text(json.dumps(chrome_trace(timeline)))
    if args.plot:
        from pipefill.schedules.plot import plot_timeline

        plot_timeline(timeline, args.plot, time_unit="units" if source == "uniform" else "s")
    return 0


def _first(*values: Any) -> Any:
    """The first value that is not None (a flag, then the manifest's value, then a default)."""
    return next((v for v in values if v is not None), None)


def _shape(args: argparse.Namespace, job: PipelineTrainingJob | None) -> PipelineShape:
    """The manifest's shape as the trainer derives it (:func:`pipefill.spec.shape.from_spec`), or, with flags, the
    manifest's values overridden by them (errors then name the flags)."""
    pipe = job.spec.pipeline if job is not None else None
    schedule = _first(args.schedule, pipe and str(pipe.schedule), "1f1b")
    csv_text = None
    if canonical_name(schedule) == "custom":
        if args.schedule_csv is None:
            raise ValueError("schedule custom needs --schedule-csv FILE (torch's compute-only CSV, one row per rank)")
        csv_text = Path(args.schedule_csv).read_text()
    if job is not None and all(getattr(args, flag) is None for flag in _SHAPE_FLAGS):
        return from_spec(job, schedule_csv=csv_text)
    stages = _first(args.stages, pipe and pipe.stages)
    if stages is None:
        raise ValueError("--stages is required (pipeline ranks p), or pass a manifest with -f")
    return derive_shape(
        schedule=schedule,
        stages=stages,
        microbatches=_first(args.microbatches, pipe and pipe.microbatches),
        global_batch=_first(args.global_batch, pipe and pipe.global_batch),
        data_parallel=_first(args.data_parallel, pipe and pipe.data_parallel, 1),
        microbatch_size=args.microbatch_size,
        virtual_stages=_first(args.virtual_stages, pipe and pipe.virtual_stages),
        csv_text=csv_text,
        names=FLAG_NAMES,
    )


def _model(args: argparse.Namespace, job: PipelineTrainingJob | None) -> _Model:
    spec = job.spec if job is not None else None
    layers, hidden, _heads = spec.model.dims() if spec is not None else (None, None, None)
    return _Model(
        layers=_first(args.layers, layers),
        hidden_size=_first(args.hidden_size, hidden),
        params=args.params,
        vocab_size=_first(args.vocab_size, spec and spec.model.vocab_size, 50304),
        seq_len=_first(args.seq_len, spec and spec.model.seq_len, 2048),
        tied=bool(spec and spec.model.tied_embeddings),
        activation_checkpointing=bool(
            _first(args.activation_checkpointing, spec and spec.pipeline.activation_checkpointing, False)
        ),
    )


def _costs(args: argparse.Namespace, model: _Model, shape: PipelineShape) -> tuple[Costs, MemoryModel | None, str]:
    schedule = shape.schedule
    source = args.costs or (
        "profile"
        if args.profile
        else "analytic"
        if (model.params is not None or model.layers is not None)
        else "uniform"
    )
    checkpointing = model.activation_checkpointing
    reserve = int(args.reserve_gib * _GIB)
    if source == "uniform":
        return Costs.uniform(), None, source
    if source == "profile":
        if not args.profile:
            raise ValueError("--costs profile needs --profile FILE (the JSON the trainer writes)")
        data = json.loads(Path(args.profile).read_text())
        profiled = MemoryModel.from_profile(data, activation_checkpointing=checkpointing, reserve_bytes=reserve)
        return Costs.from_profile(data), profiled, source
    layers, hidden, params = model.layers, model.hidden_size, model.params
    if params is None:
        if layers is None or hidden is None:
            raise ValueError("analytic costs need --params, or --layers and --hidden-size (or a manifest)")
        embeddings = model.vocab_size * hidden * (1 if model.tied else 2)
        params = 12 * layers * hidden * hidden + embeddings
    tokens = model.seq_len * shape.microbatch_size
    tp = args.tensor_parallel
    costs = Costs.analytic(
        params=params,
        tokens_per_mb=tokens,
        stages=schedule.num_stages,
        device_tflops=args.device_tflops,
        layers=layers,
        hidden_size=hidden,
        mfu=args.mfu,
        tensor_parallel=tp,
        data_parallel=shape.data_parallel,
        virtual_stages=schedule.virtual_stages,
        activation_checkpointing=checkpointing,
        p2p_bandwidth_bytes_per_s=args.p2p_gbps * 1e9,
        p2p_latency_s=args.p2p_latency_us * 1e-6,
        dp_bandwidth_bytes_per_s=args.dp_gbps * 1e9,
    )
    memory: MemoryModel | None = None
    if layers is not None and hidden is not None:
        memory = MemoryModel.analytic(
            params=params,
            stages=schedule.num_stages,
            layers=layers,
            hidden_size=hidden,
            tokens_per_mb=tokens,
            device_bytes=int(args.device_memory_gib * _GIB),
            tensor_parallel=tp,
            activation_checkpointing=checkpointing,
            reserve_bytes=reserve,
        )
    return costs, memory, source


def _fill(args: argparse.Namespace, timeline: Timeline) -> FillProjection | None:
    if not args.fill_profile:
        given = [
            f
            for f, v in (
                ("--fill-steps", args.fill_steps),
                ("--fill-guard-ms", args.fill_guard_ms),
                ("--fill-switch-ms", args.fill_switch_ms),
            )
            if v is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --fill-profile FILE (the fill workload to project)")
        return None
    for flag, value in (("--fill-guard-ms", args.fill_guard_ms), ("--fill-switch-ms", args.fill_switch_ms)):
        if value is not None and not value >= 0:
            raise ValueError(f"{flag} {value}: must be milliseconds >= 0")
    profile = FillProfile.from_json(Path(args.fill_profile).read_text())
    if args.fill_guard_ms is not None:
        profile = replace(profile, guard_s=args.fill_guard_ms / 1e3)
    if args.fill_switch_ms is not None:
        profile = replace(profile, switch_s=args.fill_switch_ms / 1e3)
    return project_fill(timeline, profile, steps=args.fill_steps)
