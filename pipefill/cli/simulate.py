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
from pathlib import Path
from typing import Any

from pipefill.schedules import (
    SCHEDULE_NAMES,
    Costs,
    FillProfile,
    FillProjection,
    MemoryModel,
    Schedule,
    Timeline,
    build_schedule,
    project_fill,
    simulate,
)
from pipefill.schedules.report import format_report
from pipefill.schedules.trace import chrome_trace

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
    out.add_argument("--fill-profile", metavar="FILE", help="fill workload JSON: time and memory per batch size")
    mode = out.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print the whole result as JSON")
    mode.add_argument("--order", action="store_true", help='print each rank\'s action order as {"ranks": {...}}')
    out.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the timeline")
    out.add_argument("--plot", metavar="FILE", help="draw the timeline (PNG; needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    try:
        job = _job_settings(args)
        schedule = _schedule(job)
        if args.order:
            print(json.dumps({"ranks": schedule.order_dict()}))
            return 0
        costs, memory, source = _costs(args, job, schedule)
        timeline = simulate(schedule, costs, memory, validate=False)  # build_schedule validated it
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


def _job_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Merge the manifest (if any) and the flags; flags win."""
    job: dict[str, Any] = {"schedule": "1f1b", "vocab_size": 50304, "seq_len": 2048, "data_parallel": 1}
    if args.manifest:
        from pipefill.spec import load_training_job

        spec = load_training_job(args.manifest).spec
        layers, hidden, _heads = spec.model.dims()
        pipe = spec.pipeline
        job.update(
            schedule=pipe.schedule.value,
            stages=pipe.stages,
            microbatches=pipe.microbatches,
            virtual_stages=pipe.virtual_stages,
            global_batch=pipe.global_batch,
            data_parallel=pipe.data_parallel,
            activation_checkpointing=pipe.activation_checkpointing,
            layers=layers,
            hidden_size=hidden,
            seq_len=spec.model.seq_len,
            vocab_size=spec.model.vocab_size,
            tied=spec.model.tied_embeddings,
        )
    for key in (
        "schedule",
        "stages",
        "microbatches",
        "virtual_stages",
        "global_batch",
        "data_parallel",
        "layers",
        "hidden_size",
        "seq_len",
        "vocab_size",
        "microbatch_size",
        "params",
        "activation_checkpointing",
        "schedule_csv",
    ):
        value = getattr(args, key)
        if value is not None:
            job[key] = value
    if "stages" not in job:
        raise ValueError("--stages is required (pipeline ranks p), or pass a manifest with -f")
    dp, gb = job["data_parallel"], job.get("global_batch")
    if gb is not None and "microbatch_size" not in job and "microbatches" in job:
        per_replica, rest = divmod(gb, dp * job["microbatches"])
        if rest or per_replica < 1:
            raise ValueError(
                f"global batch {gb} is not divisible by data_parallel × microbatches = "
                f"{dp * job['microbatches']}; change one of them"
            )
        job["microbatch_size"] = per_replica
    if "microbatches" not in job:
        if gb is None:
            raise ValueError("--microbatches is required (or --global-batch with --data-parallel)")
        mbs = job.setdefault("microbatch_size", 1)
        job["microbatches"], rest = divmod(gb, dp * mbs)
        if rest or job["microbatches"] < 1:
            raise ValueError(f"global batch {gb} is not divisible by data_parallel × microbatch_size = {dp * mbs}")
    job.setdefault("microbatch_size", 1)
    return job


def _schedule(job: dict[str, Any]) -> Schedule:
    csv_text = None
    if job["schedule"] == "custom":
        path = job.get("schedule_csv")
        if path is None:
            raise ValueError("schedule custom needs --schedule-csv FILE (torch's compute-only CSV, one row per rank)")
        csv_text = Path(path).read_text()
    return build_schedule(
        job["schedule"],
        ranks=job["stages"],
        microbatches=job["microbatches"],
        virtual_stages=job.get("virtual_stages"),
        csv_text=csv_text,
    )


def _costs(args: argparse.Namespace, job: dict[str, Any], schedule: Schedule) -> tuple[Costs, MemoryModel | None, str]:
    source = args.costs or (
        "profile" if args.profile else "analytic" if ("params" in job or "layers" in job) else "uniform"
    )
    checkpointing = bool(job.get("activation_checkpointing", False))
    reserve = int(args.reserve_gib * _GIB)
    if source == "uniform":
        return Costs.uniform(), None, source
    if source == "profile":
        if not args.profile:
            raise ValueError("--costs profile needs --profile FILE (the JSON the trainer writes)")
        data = json.loads(Path(args.profile).read_text())
        profiled = MemoryModel.from_profile(data, activation_checkpointing=checkpointing, reserve_bytes=reserve)
        return Costs.from_profile(data), profiled, source
    layers, hidden = job.get("layers"), job.get("hidden_size")
    params = job.get("params")
    if params is None:
        if layers is None or hidden is None:
            raise ValueError("analytic costs need --params, or --layers and --hidden-size (or a manifest)")
        embeddings = job["vocab_size"] * hidden * (1 if job.get("tied") else 2)
        params = 12 * layers * hidden * hidden + embeddings
    tokens = job["seq_len"] * job["microbatch_size"]
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
        data_parallel=job["data_parallel"],
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
        return None
    return project_fill(timeline, FillProfile.from_json(Path(args.fill_profile).read_text()))
