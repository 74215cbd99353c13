"""What a trainer's start imports: torch.distributed.checkpoint only where a ``dcp`` checkpoint is read or written.

It pulls in DTensor and symbolic shapes (1–2.5 s of every trainer start on this machine's kind, more than a third of
torch's own import), and every restart of a gang and every multi-process test pays a trainer start."""

from __future__ import annotations

import subprocess
import sys


def test_a_trainer_start_does_not_import_torch_distributed_checkpoint() -> None:
    code = (
        "import sys\n"
        "import pipefill_trainer.__main__, pipefill_trainer.runtime, pipefill_trainer.train, pipefill_trainer.checkpoint\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.checkpoint')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
