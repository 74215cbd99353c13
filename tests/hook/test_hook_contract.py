"""The hook's contract with the user's process: on by environment only, never failing the user's program, an
untested torch measured but not announced (one warning), what it imports, a fill executor's crash changing nothing,
and the trainer's metrics on the metrics port."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hook_procs import BOOT, REPO, run_example
from waiting import wait_for

from pipefill.ports import free_port
from pipefill_hook.version import ENV_ASSUME_TORCH, supported

ARGS = ["--schedule", "1F1B", "--microbatches", "4", "--steps", "6"]


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def _path(*extra: Path) -> str:
    return os.pathsep.join([*map(str, extra), str(REPO), str(REPO / "trainer-image")])


def test_supported_torch_versions() -> None:
    assert supported("2.13.0+cu130") and supported("2.13.1")
    assert not supported("2.12.1") and not supported("2.14.0") and not supported("3.13.0")


def test_the_boot_sitecustomize_installs_only_when_asked_and_runs_the_one_it_shadows(tmp_path: Path) -> None:
    other = tmp_path / "image-site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    probe = (
        "import os, sys\n"
        "print(os.environ.get('IMAGE_SITECUSTOMIZE'), any(type(f).__name__ == '_Finder' for f in sys.meta_path))\n"
    )
    base = {**os.environ, "PYTHONPATH": _path(BOOT, other)}
    base.pop("PIPEFILL_HOOK", None)
    assert _python(probe, base).stdout.split() == ["ran", "False"]
    on = _python(probe, {**base, "PIPEFILL_HOOK": "1"})
    assert on.stdout.split() == ["ran", "True"], on.stderr


def test_the_hook_imports_only_what_the_init_container_copies() -> None:
    """torch, prometheus_client, the core without the spec (no YAML, schema or CEL packages in a user's image) and
    four modules of the trainer."""
    code = (
        "import sys\n"
        "import torch.distributed.pipelining\n"
        "before = set(sys.modules)\n"
        "import pipefill_hook.patch, pipefill_hook.activate\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    proc = _python(code, {**os.environ, "PYTHONPATH": _path()})
    assert proc.returncode == 0, proc.stderr
    added = proc.stdout.split()
    trainer = {m for m in added if m.startswith("pipefill_trainer.")}
    assert trainer <= {f"pipefill_trainer.{m}" for m in ("instrument", "metrics", "devsync", "baseline")}, trainer
    tops = {m.split(".")[0] for m in added} - set(sys.stdlib_module_names)
    assert tops <= {"pipefill", "pipefill_hook", "pipefill_trainer", "prometheus_client", "torch"}, tops
    assert not [m for m in added if m.startswith(("pipefill.spec", "pipefill.cli", "pipefill.local"))]


@pytest.mark.slow
def test_an_untested_torch_is_measured_not_announced_with_one_warning(tmp_path: Path) -> None:
    plain = run_example(tmp_path / "plain", ARGS, hook=False)
    hooked = run_example(tmp_path / "hooked", ARGS, hook=True, extra_env={ENV_ASSUME_TORCH: "2.99.0"}, consume=False)
    assert hooked.losses == plain.losses
    for r in hooked.ranks:
        assert r.output.count("pipefill hook:") == 1, r.output
        assert "torch 2.99.0 is not a version the hook was tested against" in r.output
        assert not (r.out_dir.parent / f"channel{hooked.ranks.index(r)}").exists(), "a channel was created"
        assert [s.step for s in r.steps()] == list(range(6)), "steps not measured"
        assert not [b for b in r.bubbles() if b.announced]


@pytest.mark.slow
def test_a_fill_executor_crash_in_a_bubble_changes_nothing_for_the_training(tmp_path: Path) -> None:
    """A consumer takes the first bubble and dies holding it (SIGKILL, no acknowledgement): training goes on with
    the same losses, and later bubbles are still announced."""
    args = [*ARGS[:-1], "12"]
    plain = run_example(tmp_path / "plain", args, hook=False)
    crash = (
        "import os, sys\n"
        "from pipefill.channel import Consumer\n"
        "ch = Consumer.attach(channel_dir=sys.argv[1], timeout_s=60)\n"
        "b = ch.wait_bubble(timeout_s=60)\n"
        "if b is None:\n    sys.exit(3)  # the run ended before a bubble: no crash inside one\n"
        "os.kill(os.getpid(), 9)\n"
    )
    crashers: list[subprocess.Popen[str]] = []

    def start_crashers() -> None:
        for rank in range(2):
            cmd = [sys.executable, "-c", crash, str(tmp_path / "hooked" / f"channel{rank}")]
            crashers.append(subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": _path()}, text=True))

    hooked = run_example(tmp_path / "hooked", args, hook=True, consume=False, during=start_crashers)
    assert [c.wait(timeout=30) for c in crashers] == [-9, -9]
    assert hooked.losses == plain.losses
    for r in hooked.ranks:
        late = [b for b in r.bubbles() if b.announced and b.step >= 10]
        assert late, f"no bubble announced after the crash:\n{r.output}"


@pytest.mark.alone  # times a quiet core (tests/sharing.py)
@pytest.mark.slow
def test_the_trainer_metrics_are_served_on_the_metrics_port(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    seen: dict[int, str] = {}

    def announced() -> list[int]:  # the ranks seen announcing bubbles
        for rank, port in enumerate(ports):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            except OSError:
                continue
            if _value(text, "pipefill_trainer_bubbles_announced_total") > 0:
                seen[rank] = text
        return sorted(seen)

    def scrape() -> None:
        wait_for(announced, f"both ranks to serve announced bubbles on {ports}", 60, until=lambda got: got == [0, 1])

    # enough steps for a scrape to find both ranks announcing (300 steps of the default width: 20 s more for nothing)
    args = [*ARGS[:-1], "120", "--width", "256", "--batch", "64"]
    run_example(tmp_path, args, hook=True, rank_env=lambda r: {"PIPEFILL_METRICS_PORT": str(ports[r])}, during=scrape)
    assert sorted(seen) == [0, 1], "no rank served announced bubbles on its metrics port"
    for text in seen.values():
        assert _value(text, "pipefill_trainer_step") >= 4
        assert _value(text, "pipefill_trainer_bubble_seconds_total") > 0
        assert _value(text, "pipefill_trainer_hook_announcing") == 1


def _value(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_what_the_init_container_copies_is_enough_to_hook_a_process(tmp_path: Path) -> None:
    """``python -m pipefill_hook.install DIR`` (the init container), then a process with only DIR's two paths: the
    hook activates from the copy and wraps the schedules."""
    target = tmp_path / "hook"
    done = subprocess.run(
        [sys.executable, "-m", "pipefill_hook.install", str(target)], env={**os.environ, "PYTHONPATH": _path()},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    probe = (
        "import torch.distributed.pipelining.schedules as s, pipefill_hook.patch as p, pipefill, pipefill_trainer\n"
        "print(hasattr(s._wait_batch_p2p, '__wrapped__'), p._state['applied'], pipefill.__file__, pipefill_trainer.__file__)\n"
    )
    env = {**os.environ, "PIPEFILL_HOOK": "1", "PYTHONPATH": f"{target / 'boot'}{os.pathsep}{target / 'lib'}"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as in a rank pod (pipefill/pods.py): the copy stays what was copied
    out = subprocess.run(  # not in the checkout: `python -c` puts the working directory first on sys.path
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    wrapped_in, applied, core, trainer = out.stdout.split()
    assert (wrapped_in, applied) == ("True", "True")
    assert core.startswith(str(target)) and trainer.startswith(str(target)), out.stdout
    copied = {p.name for p in (target / "lib" / "pipefill_trainer").iterdir()}
    assert copied == {"__init__.py", "instrument.py", "metrics.py", "devsync.py", "baseline.py"}
