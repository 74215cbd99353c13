"""``pipefill bench trainer``: our trainer's step time (bubble instrumentation on) against torch.distributed.pipelining.

Two CPU processes (``python -m pipefill_trainer.bench_worker``), each pinned to its own core, one gloo process group.
Both engines train the *same* stage modules (the model, schedule and microbatches are identical); runs alternate in
blocks (ours, torch, ours, …) so drift in the machine's speed hits both, and medians are reported. ``--model llama``
trains a Llama-style Hugging Face model of the same shape (its config.json written here, random init; the
``huggingface`` extra) instead of our GPT, through the same model provider interface:
``{"ours_step_s", "torch_step_s", "ratio", "bubble_prediction_error_median", ...}``.
Our step is the full optimizer step (actions, step-end all-reduce, AdamW); torch's is ``schedule.step()`` plus the same
AdamW step. The prediction error is |predicted − measured| ÷ measured over the bubbles measured in our blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipefill import env
from pipefill.local.procs import free_port

__all__ = ["main"]

_SPEC = """\
apiVersion: pipefill.io/v1alpha1
kind: PipelineTrainingJob
metadata: {{name: bench-trainer}}
spec:
  model: {model}
  data: {{source: synthetic}}
  pipeline: {{stages: 2, microbatches: {m}, globalBatch: {batch}, schedule: {schedule}}}
  steps: 1000000
  checkpoint: {{path: {ckpt}, intervalSteps: 0}}
  resources: {{gpus: 0, cpu: "1", memory: 2Gi}}
  gpuSharing: {{mode: none}}
  fill: {{reservedMemory: 256Mi, minBubbleMilliseconds: 0.5, guardMilliseconds: 0.1}}
"""


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pipefill bench trainer", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"], help="schedule (one stage per rank)")
    p.add_argument(
        "--model", default="gpt", choices=["gpt", "llama"], help="our GPT, or a Llama of the same shape (Hugging Face)"
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch (samples)")
    p.add_argument("--blocks", type=int, default=6, help="alternating blocks per engine")
    p.add_argument("--steps-per-block", type=int, default=8)
    return p.parse_args(argv)


def _model(args: argparse.Namespace, tmp: Path) -> str:
    """``spec.model`` of the benchmark: our GPT, or a Llama of the same shape from a config.json written to ``tmp``."""
    if args.model == "gpt":
        return f"{{layers: {args.layers}, hiddenSize: {args.hidden}, heads: {args.heads}, seqLen: {args.seq}, vocabSize: 256}}"
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": args.hidden,
        "intermediate_size": 4 * args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "max_position_embeddings": max(args.seq, 256),
        "tie_word_embeddings": False,
    }
    (tmp / "llama").mkdir()
    (tmp / "llama" / "config.json").write_text(json.dumps(config))
    return f"{{huggingFace: {{path: {tmp / 'llama'}}}, seqLen: {args.seq}}}"


def main(argv: list[str]) -> int:
    args = _args(argv)
    with tempfile.TemporaryDirectory(prefix="pipefill-bench-") as tmp:
        spec = Path(tmp) / "job.yaml"
        spec.write_text(
            _SPEC.format(
                model=_model(args, Path(tmp)),
                m=args.microbatches,
                batch=args.batch,
                schedule=args.schedule,
                ckpt=Path(tmp) / "ckpt",
            )
        )
        port = free_port()
        procs = []
        for rank in range(2):
            environ = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                env.SPEC_FILE: str(spec),
                env.CPU_AFFINITY: str(rank % (os.cpu_count() or 1)),
                "OMP_NUM_THREADS": "1",
                env.OUT_DIR: str(Path(tmp) / f"rank{rank}"),
                # each rank announces on its own channel, as in its own pod (no fill attached)
                env.CHANNEL_DIR: str(Path(tmp) / f"channel{rank}"),
                env.BASELINE_EVERY_STEPS: "0",  # every step announces, as the instrumentation's cost is measured
            }
            cmd = [
                sys.executable, "-m", "pipefill_trainer.bench_worker", "--result", str(Path(tmp) / f"result{rank}.json"),
                "--blocks", str(args.blocks), "--steps-per-block", str(args.steps_per_block),
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            )
        outputs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode for p in procs):
            for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
                print(f"rank {rank} exited {p.returncode}:\n{out[-3000:]}", file=sys.stderr)
            return 1
        result = json.loads((Path(tmp) / "result0.json").read_text())
        other = json.loads((Path(tmp) / "result1.json").read_text())
    errors = result.pop("errors") + other.pop("errors")
    result["bubble_prediction_error_median"] = statistics.median(errors) if errors else None
    result["bubbles_measured"] = len(errors)
    result["config"] = {k: v for k, v in vars(args).items() if k != "json"}
    result["machine"] = f"{os.cpu_count()} CPU, gloo, 2 processes pinned one per core"
    print(json.dumps(result, indent=None if args.json else 1))
    return 0
