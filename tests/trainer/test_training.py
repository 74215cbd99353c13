"""The trainer entry point as real processes on gloo: resume equality, replay mode, a killed peer, bad config."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from trainer_procs import launch, wait_all
from waiting import wait_for

from pipefill import env
from pipefill.channel import Bubble, BubbleRecord, Consumer
from pipefill.events import ActionEvent, BubbleEvent, RestartEvent, StepEvent, read_events
from pipefill.ports import free_port
from pipefill.schedules.costs import Costs
from pipefill.schedules.generators import build_schedule
from pipefill.schedules.simulate import simulate
from pipefill_trainer import checkpoint as ckpt
from pipefill_trainer import reshard

pytestmark = pytest.mark.slow

SPEC = """\
apiVersion: pipefill.io/v1alpha1
kind: PipelineTrainingJob
metadata: {{name: tiny}}
spec:
  model: {{layers: 4, hiddenSize: {hidden}, heads: 2, seqLen: {seq}, vocabSize: 64, tiedEmbeddings: {tied}}}
  data: {{source: synthetic, seed: 3}}
  pipeline: {{stages: {stages}, microbatches: {m}, globalBatch: {batch}, schedule: {schedule}}}
  optimizer: {{learningRate: 0.01, warmupSteps: 2}}
  steps: {steps}
  checkpoint: {{path: {ckpt}, intervalSteps: {interval}, format: {format}}}
  resources: {{gpus: 0, cpu: "1", memory: 1Gi}}
  gpuSharing: {{mode: none}}
  fill: {{enabled: {fill}, reservedMemory: 64Mi, minBubbleMilliseconds: 0.5, guardMilliseconds: 0.1}}
"""


def write_spec(tmp: Path, name: str, **kw: object) -> Path:
    values = {
        "stages": 2,
        "hidden": 32,
        "seq": 16,
        "m": 4,
        "batch": 8,
        "schedule": "1f1b",
        "steps": 6,
        "interval": 3,
        "ckpt": tmp / f"{name}-ckpt",
        "fill": "false",
        "tied": "false",
        "format": "torch",
    }
    values.update(kw)
    path = tmp / f"{name}.yaml"
    path.write_text(SPEC.format(**values))
    return path


def run_job(spec: Path, out: Path, *, world: int = 2, args: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    procs = launch(
        ["-m", "pipefill_trainer", *args],
        world=world,
        env={env.SPEC_FILE: str(spec), env.OUT_DIR: str(out), env.COMM_TIMEOUT_S: "60"},
    )
    results = wait_all(procs, timeout_s=100)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-3000:]}"
    return results


def losses(events: Path) -> dict[int, float]:
    return {e.step: e.loss for e in read_events(events) if isinstance(e, StepEvent)}


def test_resume_reproduces_the_uninterrupted_loss_trajectory(tmp_path: Path) -> None:
    whole = write_spec(tmp_path, "whole", steps=6)
    run_job(whole, tmp_path / "whole-out")
    part = write_spec(tmp_path, "part", steps=6)
    run_job(part, tmp_path / "part-out", args=("--steps", "3"))  # stops after step 2, checkpoint at 3
    assert (tmp_path / "part-ckpt" / "latest").read_text().strip() == "3"
    assert not ckpt.is_dcp(tmp_path / "part-ckpt", 3)  # format torch, our GPT's default
    run_job(part, tmp_path / "part-out2")  # resumes at step 3
    expected, resumed = losses(tmp_path / "whole-out" / "events.jsonl"), losses(tmp_path / "part-out2" / "events.jsonl")
    assert sorted(resumed) == [3, 4, 5]
    restarts = [e for e in read_events(tmp_path / "part-out2" / "events.jsonl") if isinstance(e, RestartEvent)]
    assert {(e.step, e.checkpoint) for e in restarts} == {(3, str(tmp_path / "part-ckpt"))}
    assert len({e.pid for e in restarts}) == len(restarts) == 2  # each rank (both log into one directory here)
    for step, loss in resumed.items():
        assert loss == expected[step], f"step {step}: resumed {loss} != uninterrupted {expected[step]}"


@pytest.mark.alone  # times a quiet core (tests/sharing.py)
def test_replay_reproduces_the_simulated_bubbles_and_a_consumer_receives_them(tmp_path: Path) -> None:
    # Large enough that bubbles last milliseconds on an idle machine too (with microbatches of 1 sample every predicted
    # bubble of a quiet CI run was under the 2 ms floor): scheduling noise on a loaded 2-vCPU VM is ~0.1-1 ms.
    spec = write_spec(tmp_path, "replay", stages=4, m=4, batch=16, steps=8, interval=0, fill="true", hidden=128, seq=64)
    out, channel = tmp_path / "out", tmp_path / "channel"
    received: list[Bubble] = []
    history: list[BubbleRecord] = []

    def consume() -> None:
        with Consumer.attach(channel_dir=channel, timeout_s=60) as ch:
            while True:
                bubble = ch.wait_bubble(timeout_s=0.5)
                if bubble is not None:
                    received.append(bubble)
                    ch.acknowledge(bubble.id, used_s=0.0)
                elif not ch.trainer_alive():
                    history.extend(ch.history())
                    return

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    proc = subprocess.run(
        [sys.executable, "-m", "pipefill_trainer", "--replay-stage", "1"],
        env={**os.environ, env.SPEC_FILE: str(spec), env.OUT_DIR: str(out), env.CHANNEL_DIR: str(channel)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REPLAY MODE" in proc.stdout
    consumer.join(timeout=10)
    profile = json.loads((out / "profile.json").read_text())
    assert profile["replay"] is True
    timeline = simulate(build_schedule("1f1b", ranks=4, microbatches=4), Costs.from_profile(profile))
    predicted = timeline.bubbles(1)
    recs = [e for e in read_events(out / "events.jsonl") if isinstance(e, BubbleEvent)]
    # Judge every replayed step together (the profile took steps 0-2): one step's wait can vanish when its compute
    # runs long on a busy core, and on a slow host it did for three steps in a row (CI, session 17: the cool-down
    # wait before action 6 in none of steps 5-7).
    steps = (3, 4, 5, 6, 7)
    measured: dict[int, list[tuple[str, float]]] = {}
    for r in recs:
        if r.step in steps:
            measured.setdefault(r.idx, []).append((r.kind, (r.end_ns - r.start_ns) / 1e9))
    noise_floor_s = 0.002  # shorter predicted gaps can shift to a neighbouring action or vanish on a busy core
    checked = [b for b in predicted if b.duration_s >= noise_floor_s]
    assert checked, predicted
    for b in checked:
        seen = measured.get(b.before_action_idx, [])
        assert seen, f"bubble {b} not reproduced in steps {steps}; measured {measured}"
        assert {kind for kind, _ in seen} == {b.kind}
        assert max(d for _, d in seen) == pytest.approx(b.duration_s, rel=0.5, abs=0.01), (b, seen)
    # The replayed peers keep the modeled pace whatever the machine's load, while this rank's own compute slows on a
    # busy core and eats into its waits: the lower bound gives way by what its compute ran over the model.
    acts = [e for e in read_events(out / "events.jsonl") if isinstance(e, ActionEvent) and e.step in steps]
    modeled_s = sum(a.duration_s for a in timeline.ranks[1].actions)  # step-end work left out, as in the records
    over_s = max(0.0, sum(a.end_ns - a.start_ns for a in acts) / 1e9 / len(steps) - modeled_s)
    idle_per_step_s = sum(d for seen in measured.values() for _, d in seen) / len(steps)
    predicted_s = sum(b.duration_s for b in predicted)
    assert max(0.0, 0.5 * predicted_s - over_s) <= idle_per_step_s <= 1.5 * predicted_s, (predicted, measured, over_s)
    # the consumer saw exactly the announced bubbles, with their kinds, steps and predicted durations
    announced = [r for r in recs if r.announced]
    assert announced, "no bubble was announced"
    assert [(str(h.kind), h.step) for h in history] == [(r.kind, r.step) for r in announced]
    for h, r in zip(history, announced, strict=True):
        assert h.predicted_s == pytest.approx(r.predicted_s, abs=1e-6)
        assert h.actual_s == pytest.approx((r.end_ns - r.start_ns) / 1e9, abs=1e-3)
    late = {str(h.kind) for h in history if h.step in steps}
    assert late >= {b.kind for b in checked}  # plus slots learned from measured waits
    # live: a woken consumer sees most bubbles while they are open (a short one may close before it looks)
    assert received and {b.id for b in received} <= {h.id for h in history}


def test_a_killed_peer_ends_the_job_with_a_retryable_exit_naming_it_and_the_restarted_gang_resumes(
    tmp_path: Path,
) -> None:
    """SIGKILL of rank 1: rank 0 exits 75 naming it; the gang started again resumes from the last dcp checkpoint and
    its steps equal an uninterrupted run's. Tied embeddings: both ranks hold wte.weight, saved once."""
    spec = write_spec(tmp_path, "kill", steps=100000, interval=2, format="dcp", tied="true")
    out = tmp_path / "out"
    procs = launch(
        ["-m", "pipefill_trainer"],
        world=2,
        env={env.SPEC_FILE: str(spec), env.OUT_DIR: str(out), env.COMM_TIMEOUT_S: "60"},
    )
    try:
        events = out / "events.jsonl"

        def checkpointed() -> bool:
            assert procs[0].poll() is None, procs[0].communicate()[0]
            steps = sum(isinstance(e, StepEvent) for e in read_events(events))
            return steps >= 3 and ckpt.latest_step(tmp_path / "kill-ckpt") is not None

        wait_for(checkpointed, "3 steps and a checkpoint", 60, 0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = procs[0].communicate(timeout=30)
        assert time.monotonic() - killed_at < 30
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert procs[0].returncode == env.EXIT_RETRYABLE, output[-3000:]
    assert "peer rank 1" in output, output[-3000:]
    resume_at = ckpt.latest_step(tmp_path / "kill-ckpt")
    assert resume_at is not None and resume_at >= 2 and ckpt.is_dcp(tmp_path / "kill-ckpt", resume_at)
    end = str(resume_at + 3)
    run_job(spec, tmp_path / "restarted", args=("--steps", end))  # the gang again: every rank from the checkpoint
    whole = write_spec(tmp_path, "whole", steps=100000, interval=2, format="dcp", tied="true")
    run_job(whole, tmp_path / "whole-out", args=("--steps", end))
    expected, resumed = losses(tmp_path / "whole-out" / "events.jsonl"), losses(tmp_path / "restarted" / "events.jsonl")
    assert sorted(resumed) == list(range(resume_at, resume_at + 3))
    for step, loss in resumed.items():
        assert loss == expected[step], f"step {step}: resumed {loss} != uninterrupted {expected[step]}"


def _weights(root: Path, step: int) -> dict[str, torch.Tensor]:
    """The model's tensors of the dcp checkpoint of ``step``, by name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = root.parent / f"{root.name}-{step}.pt"
    dcp_to_torch_save(ckpt.dcp_dir(root, step), whole)
    state = torch.load(whole, weights_only=False)
    return dict(state["model"])


def test_a_dcp_checkpoint_of_2_stages_resumes_on_4_stages_and_on_1(tmp_path: Path) -> None:
    """Resharding: the step-3 checkpoint of a 2-stage run (tied embeddings) resumed by 4 ranks and by 1 gives the
    uninterrupted run's losses and final weights, to float rounding (another cut sums in another order). A torch
    checkpoint resumed on another stage count is refused naming spec.pipeline.stages, both counts and the fix."""
    whole = write_spec(tmp_path, "whole", steps=6, interval=3, format="dcp", tied="true")
    run_job(whole, tmp_path / "whole-out")
    expected = losses(tmp_path / "whole-out" / "events.jsonl")
    for stages in (4, 1):
        root = tmp_path / f"s{stages}-ckpt"
        shutil.copytree(tmp_path / "whole-ckpt", root, ignore=shutil.ignore_patterns("step-00000006"))
        (root / "latest").write_text("3\n")  # back to the step-3 checkpoint, written by 2 stages
        spec = write_spec(tmp_path, f"s{stages}", stages=stages, steps=6, interval=3, format="dcp", tied="true")
        results = run_job(spec, tmp_path / f"s{stages}-out", world=stages)
        assert "resharded from 2 stages [2, 2] on 2 ranks onto" in results[0][1], results[0][1][-2000:]
        resumed = losses(tmp_path / f"s{stages}-out" / "events.jsonl")
        assert sorted(resumed) == [3, 4, 5]
        for step, loss in resumed.items():
            assert loss == pytest.approx(expected[step], rel=1e-5), f"{stages} stages, step {step}"
        got, want = _weights(root, 6), _weights(tmp_path / "whole-ckpt", 6)
        assert got.keys() == want.keys()
        # atol 1e-5: the key part of qkv.bias has no gradient in exact arithmetic (softmax ignores a shift), and
        # AdamW scales what rounding leaves there up to the learning rate's size (~5e-6 after 3 steps); every other
        # tensor agrees to ~1e-7
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-5, msg=f"{stages} stages: {name}")
        assert json.loads((root / "step-00000006" / "layout.json").read_text())["world_size"] == stages
    # the same resume from a torch checkpoint (one file per rank; its layout as the 2 ranks wrote it) is refused
    root = tmp_path / "t-ckpt"
    reshard.write_layout(root, 3, reshard.Layout(layers_per_stage=(2, 2), world_size=2))
    ckpt.write_latest(root, 3)
    one = write_spec(tmp_path, "t", stages=1, steps=6, interval=3)
    proc = subprocess.run(
        [sys.executable, "-m", "pipefill_trainer"],
        env={**os.environ, env.SPEC_FILE: str(one), "WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())},
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == env.EXIT_INVALID_CONFIG, proc.stderr[-3000:]
    assert (
        "spec.pipeline.stages (× virtualStages): the job has 1 stages, the checkpoint was written by 2" in proc.stderr
    )
    assert "set the stages back to 2 stages" in proc.stderr


def test_invalid_world_size_is_a_permanent_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "bad")
    proc = subprocess.run(
        [sys.executable, "-m", "pipefill_trainer"],
        env={**os.environ, env.SPEC_FILE: str(spec), "WORLD_SIZE": "3", "RANK": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == env.EXIT_INVALID_CONFIG
    assert "WORLD_SIZE=3" in proc.stderr


HF_SPEC = """\
apiVersion: pipefill.io/v1alpha1
kind: PipelineTrainingJob
metadata: {{name: hf}}
spec:
  model: {{huggingFace: {{path: {model}, exportPath: {export}}}, seqLen: 32}}
  data: {{source: synthetic, seed: 3}}
  pipeline: {{stages: 2, virtualStages: 2, microbatches: 4, globalBatch: 8, schedule: zbv}}
  optimizer: {{learningRate: 0.01, warmupSteps: 2}}
  steps: 6
  checkpoint: {{path: {ckpt}, intervalSteps: 3}}
  resources: {{gpus: 0, cpu: "1", memory: 1Gi}}
  gpuSharing: {{mode: none}}
  fill: {{enabled: false, reservedMemory: 64Mi, minBubbleMilliseconds: 0.1, guardMilliseconds: 0.1}}
"""


def test_a_hugging_face_model_from_its_config_trains_predicts_its_bubbles_and_resumes(tmp_path: Path) -> None:
    """The Llama of examples/hf-demo.yaml through the trainer's entry point: it runs, its bubbles are predicted from
    the profile (announcing them is the provider-independent channel's, tested above), and a resume from the step-3
    checkpoint (dcp, the default for Hugging Face models) reproduces the uninterrupted losses. ZB-V: each rank holds
    two stages, rank 0 the first and the last, so the tied embedding and head are one tensor there."""
    model = Path(__file__).parents[2] / "examples" / "models" / "llama-tiny"
    spec = tmp_path / "hf.yaml"
    export = tmp_path / "export"
    spec.write_text(HF_SPEC.format(model=model, ckpt=tmp_path / "ckpt", export=export))
    run_job(spec, tmp_path / "out")
    events = tmp_path / "out" / "events.jsonl"
    whole = losses(events)
    assert sorted(whole) == list(range(6))  # random tokens: the loss stays near log(256)
    bubbles = [e for e in read_events(events) if isinstance(e, BubbleEvent)]
    assert bubbles and all(b.step >= 3 for b in bubbles)  # profiled in steps 0-2, then predicted
    assert any(b.predicted_s > 0 for b in bubbles), "no bubble of the Hugging Face job was predicted"
    assert ckpt.is_dcp(tmp_path / "ckpt", 3)
    _check_export(export, model)
    first_export = export.rename(tmp_path / "first-export")
    (tmp_path / "ckpt" / "latest").write_text("3\n")  # back to the step-3 checkpoint
    run_job(spec, tmp_path / "resumed")
    resumed = losses(tmp_path / "resumed" / "events.jsonl")
    assert sorted(resumed) == [3, 4, 5]
    for step, loss in resumed.items():
        assert loss == whole[step], f"step {step}: resumed {loss} != uninterrupted {whole[step]}"
    # the resumed run ends with the uninterrupted run's weights, exported again
    from safetensors.torch import load_file

    again, before = load_file(export / "model.safetensors"), load_file(first_export / "model.safetensors")
    assert again.keys() == before.keys() and all(torch.equal(again[k], before[k]) for k in before)


def _check_export(export: Path, source: Path) -> None:
    """The exported directory loads with transformers and as pretrained weights of our provider (cut into stages),
    and both give the same loss; it holds the trained weights, not the initial ones."""
    from transformers import AutoModelForCausalLM

    from pipefill_trainer.hf import HuggingFaceProvider, read_config

    torch.set_num_threads(1)
    trained = AutoModelForCausalLM.from_pretrained(export)
    provider = HuggingFaceProvider(read_config(export), seq_len=32, weights_dir=export)
    stages = [
        provider.build_stage(stage_idx=s, num_stages=2, layers=r, device=torch.device("cpu"))
        for s, r in enumerate([range(0, 1), range(1, 4)])
    ]
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(5))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        ours = provider.loss(stages[1](stages[0](x)), y)
        theirs = torch.nn.functional.cross_entropy(trained(x).logits.flatten(0, 1), y.flatten())
        torch.testing.assert_close(ours, theirs)
        initial = HuggingFaceProvider(read_config(source), seq_len=32, seed=3)
        start = initial.build_stage(stage_idx=0, num_stages=1, layers=range(4), device=torch.device("cpu"))
        assert not torch.equal(start.state_dict()["model.norm.weight"], trained.state_dict()["model.norm.weight"])
