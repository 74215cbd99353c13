"""The bubble hook: fills the bubbles of a training command we did not write.

A user's own ``torch.distributed.pipelining`` training (torchtitan, or a script of theirs run with ``torchrun``) is
instrumented in-process, unchanged: :mod:`pipefill_hook.boot` holds a ``sitecustomize`` that, with
``PIPEFILL_HOOK=1`` in the environment, waits for the user's process to import
``torch.distributed.pipelining.schedules`` and then wraps the schedules' ``step``, the stages' compute calls, the
schedules' point-to-point waits and the first blocking collective after a step (:mod:`pipefill_hook.patch`). From
those it measures every wait, predicts this rank's bubbles from the schedule's own action order and the measured
action costs with our timeline simulator (:mod:`pipefill_hook.session`), and announces them on the bubble channel with
the trainer's own announcer, metrics (``pipefill_trainer_*``) and event log. What it may import: torch, the
torch-free core (``pipefill``), prometheus_client and the trainer's announcer, metrics, device-sync and baseline
modules (the import contract in pyproject.toml): the operator's init container copies exactly these into the user's
pod (docs/trainer.md, "Your own training command").

This module imports nothing: the sitecustomize imports it in every Python process of the pod.
"""

__all__ = ["ENV_ON"]

ENV_ON = "PIPEFILL_HOOK"
"""``1``: instrument this process's ``torch.distributed.pipelining`` schedules; anything else: do nothing."""
