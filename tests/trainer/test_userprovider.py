"""Your own model (spec.model.python): a function returning a model provider, from a directory (the fill storage or a
mounted ConfigMap) or the trainer image; every failure a ProviderError naming the provider and the fix, and the
trainer exits 2 (permanent) for it. End to end: the example's provider (examples/user-model) from its ConfigMap trains
under `pipefill local`; one whose stage returns other shapes than it declares ends the job with exit 2 naming the
provider, without a restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import launched
import pytest
import yaml

from pipefill.events import StepEvent, read_events
from pipefill_trainer.provider import ProviderError
from pipefill_trainer.userprovider import check_provider, load_provider

ROOT = Path(__file__).resolve().parents[2]

MODEL_PY = """\
from pipefill_trainer.model import GPTConfig
from pipefill_trainer.provider import GPTProvider, TensorMeta

from . import sizes


class Misdeclared(GPTProvider):
    def activations(self, *, stage_idx, num_stages, mb_size):
        (meta,) = super().activations(stage_idx=stage_idx, num_stages=num_stages, mb_size=mb_size)
        return (TensorMeta((meta.shape[0], meta.shape[1], meta.shape[2] + 1), meta.dtype),)


def build(*, seq_len, seed):
    return GPTProvider(GPTConfig(layers=sizes.LAYERS, hidden=32, heads=2, seq_len=seq_len, vocab_size=256, seed=seed))


def misdeclared(*, seq_len, seed):
    return Misdeclared(GPTConfig(layers=2, hidden=32, heads=2, seq_len=seq_len, vocab_size=256, seed=seed))


def raises(*, seq_len, seed):
    raise RuntimeError("no weights here")


def not_a_provider(*, seq_len, seed):
    return {"layers": 2}
"""


def _code(tmp: Path) -> Path:
    code = tmp / "code"
    code.mkdir()
    (code / "mymodel.py").write_text(MODEL_PY)
    (code / "sizes.py").write_text("LAYERS = 4\n")  # imported relatively: the code is a private package
    return code


def test_a_provider_from_a_directory_is_loaded_and_called_with_the_specs_values(tmp_path: Path) -> None:
    provider = load_provider("mymodel:build", code_dir=_code(tmp_path), seq_len=16, seed=3)
    assert (provider.name, provider.layers, provider.seq_len, provider.vocab_size) == ("gpt", 4, 16, 256)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (
            "mymodel:raises",
            r"model provider 'mymodel:raises' raised \(RuntimeError: no weights here\); fix the function",
        ),
        (
            "mymodel:not_a_provider",
            r"model provider 'mymodel:not_a_provider' returned a dict, which lacks build_stage, activations, .*layers",
        ),
        ("mymodel:nothere", r"module 'mymodel' from spec\.model\.python\.code .* has no function 'nothere'"),
        ("other:build", r"module 'other' is not in spec\.model\.python\.code .*; add other\.py there"),
    ],
)
def test_a_provider_that_cannot_work_is_a_provider_error_naming_it(tmp_path: Path, function: str, message: str) -> None:
    with pytest.raises(ProviderError, match=message):
        load_provider(function, code_dir=_code(tmp_path), seq_len=16, seed=0)


def test_a_provider_from_the_image_must_be_importable() -> None:
    with pytest.raises(
        ProviderError, match=r"cannot import module 'no_such_package.models' .*; install it in the trainer image"
    ):
        load_provider("no_such_package.models:build", code_dir=None, seq_len=16, seed=0)
    with pytest.raises(ProviderError, match=r"'json' has no function 'nothing'"):
        load_provider("json:nothing", code_dir=None, seq_len=16, seed=0)
    with pytest.raises(ProviderError, match=r"lacks .*name"):
        check_provider(object(), what="x")


def _job(tmp: Path, *, function: str = "tinymixer:build", config_map: str = "tinymixer-code") -> Path:
    """examples/user-model/job.yaml, short, its checkpoints and outputs under ``tmp``."""
    job = yaml.safe_load((ROOT / "examples" / "user-model" / "job.yaml").read_text())
    job["spec"]["model"]["python"] = {"function": function, "code": {"configMap": config_map}}
    job["spec"]["model"]["seqLen"] = 16
    job["spec"]["steps"] = 4
    job["spec"]["checkpoint"] = {"path": str(tmp / "ckpt"), "intervalSteps": 0}
    job["spec"]["fill"]["enabled"] = False
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _local(tmp: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    args = [a for p in files for a in ("-f", str(p))]
    args += ["--out", str(tmp / "out"), "--plain", "--no-timeline", "--metrics-port", "0"]
    return launched.run(
        [sys.executable, "-m", "pipefill", "local", *args],
        capture_output=True,
        text=True,
        timeout=110,
    )


@pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)
@pytest.mark.slow
def test_the_example_provider_from_its_configmap_trains_under_pipefill_local(tmp_path: Path) -> None:
    config_map = ROOT / "examples" / "user-model" / "model-configmap.yaml"
    done = _local(tmp_path, _job(tmp_path), config_map)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = tmp_path / "out" / "ranks" / "1" / "trainer" / "events.jsonl"
    losses = [e.loss for e in read_events(events) if isinstance(e, StepEvent)]
    assert len(losses) == 4 and losses[-1] < losses[0]


@pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)
@pytest.mark.slow
def test_a_stage_that_breaks_its_declaration_fails_the_job_permanently_naming_the_provider(tmp_path: Path) -> None:
    config_map = tmp_path / "code.yaml"
    data = {"mymodel.py": MODEL_PY, "sizes.py": "LAYERS = 4\n"}
    config_map.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "my-model"}, "data": data})
    )
    done = _local(tmp_path, _job(tmp_path, function="mymodel:misdeclared", config_map="my-model"), config_map)
    assert done.returncode != 0
    log = (tmp_path / "out" / "ranks" / "0" / "trainer").glob("*.log")
    text = done.stdout + done.stderr + "".join(p.read_text() for p in log)
    expected = (
        "-0): trainer exited with code 2: invalid configuration: model provider 'gpt': stage 0 returned 1 tensors "
        "[([4, 16, 32], 'torch.float32')], but its activations() declare [([4, 16, 33], 'torch.float32')]"
    )
    assert expected in text, text[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["outcome"]["job_restarts"] == 0, report["outcome"]  # permanent: no restart storm


def test_any_providers_linear_layers_get_the_zero_bubble_split_and_the_rest_is_named() -> None:
    from torch import nn

    from pipefill_trainer.model import DeferrableLinear, make_deferrable, undeferred

    stage = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4), nn.Conv1d(4, 4, 2), nn.LayerNorm(4))
    assert make_deferrable(stage) == 1 and isinstance(stage[1], DeferrableLinear)
    assert undeferred(stage) == ["Conv1d (2)"]  # embeddings and norms: computed in I by design


def test_the_examples_configmap_holds_its_module_and_the_image_form_loads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    example = ROOT / "examples" / "user-model"
    config_map = yaml.safe_load((example / "model-configmap.yaml").read_text())
    assert config_map["data"]["tinymixer.py"] == (example / "tinymixer.py").read_text()
    monkeypatch.syspath_prepend(str(example))  # as the Dockerfile's PYTHONPATH puts it on the image's path
    provider = load_provider("tinymixer:build", code_dir=None, seq_len=16, seed=0)
    assert (provider.name, provider.layers, provider.vocab_size) == ("tinymixer", 4, 256)
