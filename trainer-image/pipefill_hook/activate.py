"""Install the hook in this process without importing torch: a meta-path finder that wraps the pipelining
schedules the moment the user's code imports them (:func:`pipefill_hook.patch.apply`). A process that never imports
``torch.distributed.pipelining`` (torchrun's launcher, a data loader worker) is not touched.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from pipefill.importwatch import when_imported

__all__ = ["TARGET", "install"]

TARGET = "torch.distributed.pipelining.schedules"


def _on_import(module: ModuleType) -> None:
    """The schedules module has just run: wrap it (never fail the user's import)."""
    try:
        from pipefill import env
        from pipefill_hook.patch import apply
        from pipefill_hook.session import Session, warn
        from pipefill_hook.settings import HookSettings
        from pipefill_hook.version import SUPPORTED_TORCH, supported, torch_version

        version = torch_version()
        announce = supported(version)
        settings = HookSettings.from_env()
        if not announce:
            warn(
                f"torch {version} is not a version the hook was tested against ({', '.join(SUPPORTED_TORCH)}): "
                "measuring and reporting only, announcing no bubble"
            )
        affinity = os.environ.get(env.CPU_AFFINITY, "")
        if affinity:  # pipefill local: one core plays one GPU, shared with the rank's fill executor
            os.sched_setaffinity(0, env.cpu_list(affinity))
        apply(module, lambda: Session(settings, announce=announce))
    except Exception as exc:
        print(f"pipefill hook: not installed ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def install() -> None:
    """Wrap the schedules at their import (now, when already imported); idempotent."""
    when_imported(TARGET, _on_import)
