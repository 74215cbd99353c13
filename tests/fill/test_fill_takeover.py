"""The commit fence, raced by real processes: an owner at epoch 1 that never learns its slice moved (a lost node's
executor) commits after every step while the new owner at epoch 2 takes the slice over. The old owner is refused at
its first commit after the takeover, writes nothing more, and the job's outputs are byte-identical to one
uninterrupted run: zero samples lost, zero repeated."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fill_helpers import subprocess_env, write_job
from launched import Proc, popen

from pipefill.spec import load_file
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16}
TOTAL = 4000  # the old owner (a commit per sample) cannot finish before the new one has started


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    (job,) = load_file(write_job(tmp_path_factory.mktemp("reference"), "ref", total=TOTAL, parameters=PARAMS))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    while not task.done():
        task.step(64)
    assert task.finish()
    return (task.spec.output_dir / "outputs.npy").read_bytes()


def _owner(manifest: Path, epoch: int, batch: int) -> Proc:
    argv = [sys.executable, "-m", "_own", str(manifest), str(epoch), str(batch)]
    return popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_stale_owner_is_refused_at_commit_and_nothing_is_lost_or_repeated(
    tmp_path: Path, reference: bytes, seed: int
) -> None:
    rng = random.Random(seed)
    manifest = write_job(tmp_path, "j", total=TOTAL, parameters=PARAMS, output=tmp_path / "out")
    old = _owner(manifest, 1, 1)
    assert old.stdout is not None and old.stdout.readline() == "READY 0\n"
    takeover_at = rng.randrange(40, 400)
    commits = []
    while not commits or commits[-1] < takeover_at:
        line = old.stdout.readline()
        assert line.startswith("COMMIT"), (
            f"the old owner stopped early: {line!r} {old.stderr.read() if old.stderr else ''}"
        )
        commits.append(int(line.split()[1]))
    new = _owner(manifest, 2, 64)  # the old one goes on committing meanwhile
    new_out, new_err = new.communicate(timeout=120)
    old_rest, old_err = old.communicate(timeout=120)
    assert new.returncode == 0 and old.returncode == 0, new_err + old_err
    ready = int(new_out.splitlines()[0].split()[1])
    assert new_out.splitlines()[-1] == "DONE"
    old_lines = old_rest.splitlines()
    commits += [int(line.split()[1]) for line in old_lines if line.startswith("COMMIT")]
    assert (
        old_lines[-1].startswith("SUPERSEDED")
        and "taken over by epoch 2 (this executor holds epoch 1)" in old_lines[-1]
    )
    assert commits[-1] == ready  # every commit of the old owner came before the takeover, which resumed from the last
    assert takeover_at <= ready < TOTAL
    assert (tmp_path / "out" / "outputs.npy").read_bytes() == reference
    assert read_outputs(tmp_path / "out")["sample_id"].tolist() == list(range(TOTAL))
