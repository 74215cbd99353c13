"""``pipefill simulate``: order, JSON, table, trace, plot, manifest input, fill projection, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipefill.cli import main
from pipefill.schedules import build_schedule, dump_csv

EXAMPLES = Path(__file__).resolve().parents[2] / "pipefill" / "schedules" / "examples"
FILL = EXAMPLES / "fill-1.3b-inference-h100.json"
PROFILE = EXAMPLES / "profile-gpt-1.3b-4stages-a100.json"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["simulate", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("name", "v"), [("1f1b", "1"), ("interleaved-1f1b", "2"), ("zbv", "2")])
def test_order_prints_torch_spelling_per_rank(capsys: pytest.CaptureFixture[str], name: str, v: str) -> None:
    out = run_json(capsys, "--schedule", name, "--stages", "4", "--microbatches", "8", "--virtual-stages", v, "--order")
    assert out == {"ranks": build_schedule(name, ranks=4, microbatches=8, virtual_stages=int(v)).order_dict()}
    assert out["ranks"]["0"][:2] == (["0F0", "0F1"])


def test_json_with_uniform_costs_checks_the_formula(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys, "--schedule", "gpipe", "--stages", "4", "--microbatches", "12", "--costs", "uniform", "--json"
    )
    assert out["bubble_fraction"] == pytest.approx(3 / 15)
    assert out["costs"] == "uniform" and len(out["ranks"]) == 4
    rank = out["ranks"][1]
    assert rank["rank"] == 1 and rank["bubble_fraction"] == pytest.approx(3 / 15)
    for bubble in rank["bubbles"]:
        assert set(bubble) >= {"start_s", "duration_s", "kind", "free_bytes", "before_action_idx"}
        assert bubble["free_bytes"] is None  # uniform costs come without a memory model


def test_table_lists_bubbles_by_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "bubble fraction 27.3%" in out
    assert "warm-up" in out and "cool-down" in out and "end-of-step" in out


SCALE_8K = (
    *("--schedule", "1f1b", "--stages", "16", "--global-batch", "1024", "--data-parallel", "64"),
    *("--params", "40B", "--layers", "48", "--hidden-size", "8192", "--seq-len", "2048", "--tensor-parallel", "8"),
)
"""docs/scale.md's 8K-GPU 1F1B configuration"""


def test_analytic_costs_give_free_memory_and_fill_gain(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *SCALE_8K, "--fill-profile", str(FILL), "--json")
    assert out["microbatches"] == 16 and out["costs"] == "analytic"
    assert 0.4 < out["bubble_fraction"] < 0.6  # (p − 1)/(m + p − 1) = 48% plus communication
    assert all(b["free_bytes"] > 0 for r in out["ranks"] for b in r["bubbles"])
    assert 0.3 < out["fill"]["utilization_gain"] < 1.0
    assert out["fill"]["steps"] == "pieces"  # the example profile has 24 layer pieces a step


def test_pieces_use_the_short_bubbles_whole_steps_leave(capsys: pytest.CaptureFixture[str]) -> None:
    whole = run_json(capsys, *SCALE_8K, "--fill-profile", str(FILL), "--fill-steps", "whole", "--json")["fill"]
    pieces = run_json(capsys, *SCALE_8K, "--fill-profile", str(FILL), "--fill-steps", "pieces", "--json")["fill"]
    assert whole["steps"] == "whole" and pieces["steps"] == "pieces"
    # whole batches leave 1F1B's 3 ms cool-down gaps and the long bubbles' tails empty (docs/scale.md: 72 %)
    assert 0.70 < whole["bubble_use"] < 0.75
    assert pieces["bubble_use"] > whole["bubble_use"] + 0.1
    assert pieces["samples_per_step"] > whole["samples_per_step"]
    assert all(len(sizes) == 1 for sizes in pieces["batch_sizes"])  # one batch in flight per rank
    # a bigger guard leaves less of each bubble; none at all would leave more
    guarded = run_json(
        capsys, *SCALE_8K, "--fill-profile", str(FILL), "--fill-guard-ms", "2", "--fill-switch-ms", "0", "--json"
    )["fill"]
    assert guarded["bubble_use"] < pieces["bubble_use"]


def test_the_fill_executors_profile_record_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    record = {  # what the fill executor's profile cache holds (fill-image/pipefill_fill/profilecache.py)
        "workload_key": "k",
        "workload_id": "builtin:encoder-inference",
        "complete": True,
        "points": [
            {"batch_size": 1, "step_s": 0.004, "peak_bytes": 1 << 20, "items_per_step": None, "piece_s": [0.002] * 2},
            {"batch_size": 4, "step_s": 0.012, "peak_bytes": 4 << 20, "items_per_step": None},
        ],
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(record))
    argv = ("--stages", "4", "--microbatches", "8", "--costs", "uniform", "--fill-profile", str(path))
    out = run_json(capsys, *argv, "--fill-guard-ms", "0", "--json")["fill"]
    assert out["workload"] == "builtin:encoder-inference" and out["steps"] == "pieces"
    assert out["bubble_use"] > 0.9  # uniform costs: bubbles of whole time units, pieces of 2 ms
    assert main(["simulate", *argv]) == 0
    assert "fill workload builtin:encoder-inference in pieces:" in capsys.readouterr().out


def test_measured_profile(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--stages", "4", "--microbatches", "8", "--profile", str(PROFILE), "--json")
    assert out["costs"] == "profile"
    assert out["ranks"][0]["peak_used_bytes"] > 4 * (3 << 30)  # 4 microbatches of ~3.3 GiB in flight on rank 0


def test_manifest_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: pipefill.io/v1alpha1\nkind: PipelineTrainingJob\nmetadata: {name: gpt}\n"
        "spec:\n  model: {preset: gpt-1.3b, seqLen: 2048, vocabSize: 50304}\n"
        "  pipeline: {stages: 8, microbatches: 16, globalBatch: 256, schedule: interleaved-1f1b, virtualStages: 2,"
        " dataParallel: 2, activationCheckpointing: true}\n"
    )
    out = run_json(capsys, "-f", str(manifest), "--json")
    assert (out["schedule"], out["ranks_count"], out["stages"], out["microbatches"]) == ("interleaved-1f1b", 8, 16, 16)
    assert out["costs"] == "analytic"
    overridden = run_json(capsys, "-f", str(manifest), "--microbatches", "32", "--costs", "uniform", "--json")
    assert overridden["microbatches"] == 32


def test_custom_schedule_from_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv_file = tmp_path / "s.csv"
    csv_file.write_text(dump_csv(build_schedule("zbv", ranks=2, microbatches=4)))
    out = run_json(
        capsys,
        "--schedule",
        "custom",
        "--schedule-csv",
        str(csv_file),
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--json",
    )
    assert out["placement"] == "v" and out["virtual_stages"] == 2


def test_trace_and_plot_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    argv = [
        "simulate",
        "--schedule",
        "zero-bubble-h1",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--virtual-stages",
        "2",
        "--trace",
        str(trace),
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    actions = [e for e in events if e.get("ph") == "X" and e["cat"] in "FBIW"]
    assert len(actions) == 4 * 8 * 2 * 3
    assert {e["tid"] for e in actions} == {0, 1, 2, 3}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedule", "zbv", "--stages", "4", "--microbatches", "8", "--virtual-stages", "3"], "exactly 2 stages"),
        (["--microbatches", "8"], "--stages is required"),
        (["--stages", "4"], "--microbatches is required"),
        (["--stages", "4", "--microbatches", "8", "--schedule", "custom"], "needs --schedule-csv FILE"),
        (["--stages", "4", "--global-batch", "100", "--data-parallel", "3"], "not divisible"),
        (["--stages", "4", "--microbatches", "8", "--costs", "analytic"], "analytic costs need --params"),
        (["--stages", "4", "--microbatches", "8", "--fill-steps", "pieces"], "--fill-steps: only with --fill-profile"),
        (
            ["--stages", "4", "--microbatches", "8", "--fill-profile", str(FILL), "--fill-guard-ms", "-1"],
            "--fill-guard-ms -1.0: must be milliseconds >= 0",
        ),
        (
            ["--stages", "4", "--microbatches", "8", "--fill-profile", str(PROFILE)],
            "fill profile 'batches' must be a non-empty list",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_core_imports_without_torch_or_matplotlib() -> None:
    code = (
        "import sys, pipefill.schedules, pipefill.cli.simulate; "
        "bad = {'torch', 'matplotlib', 'numpy'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
