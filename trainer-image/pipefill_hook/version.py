"""Which torch versions the hook was tested against, and the seam that lets a test pretend to be another one.

The hook wraps private names of ``torch.distributed.pipelining`` (``schedules._wait_batch_p2p``) whose meaning can
change in any release. On a version not listed here it still measures (waits, steps, metrics, the event log) but
announces nothing and inserts no collective of its own, and says so once.
"""

from __future__ import annotations

import os

__all__ = ["ENV_ASSUME_TORCH", "SUPPORTED_TORCH", "supported", "torch_version"]

SUPPORTED_TORCH = ("2.13",)
"""major.minor releases of torch the hook is tested against (tests/hook)"""

ENV_ASSUME_TORCH = "PIPEFILL_HOOK_ASSUME_TORCH"
"""test seam: the torch version the hook believes it runs under (``2.99.0``: an untested one)"""


def torch_version() -> str:
    """The running torch's version, or the one :data:`ENV_ASSUME_TORCH` names."""
    assumed = os.environ.get(ENV_ASSUME_TORCH)
    if assumed:
        return assumed
    import torch

    return str(torch.__version__)


def supported(version: str) -> bool:
    """Whether ``version`` (``2.13.0+cu130``) is a release the hook was tested against."""
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    return major_minor in SUPPORTED_TORCH
