"""``spec.trainer``: the user's own training command in the trainer container, in place of our trainer.

The operator runs the command with the rank environment torchrun sets (and the ``PET_*`` variables torchrun reads),
so ``torchrun -m torchtitan.train …`` and ``python train.py`` both find their rank; with ``hook`` the bubble hook
(``pipefill_hook``, from our trainer image by an init container) instruments the command's
``torch.distributed.pipelining`` schedules and announces their bubbles. ``spec.model`` and ``spec.pipeline`` are our
trainer's and are refused beside it: the command builds its own model and schedule (docs/trainer.md, "Your own
training command").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.immutable import WORLD_SIZE_FIXED, immutable

__all__ = ["DEFAULT_RETRY_EXIT_CODES", "TrainerCommand"]

DEFAULT_RETRY_EXIT_CODES = (1,)
"""torchrun, and Python on an uncaught exception, exit 1, also when what ended the rank was a peer's death"""


@dataclass
class TrainerCommand:
    """Run your own training command (e.g. torchrun with torchtitan) as every rank's trainer."""

    command: list[str] = field(
        doc="The command (the container's entrypoint), e.g. [torchrun] or [python, -m, mytrainer].", max_items=64
    )
    stages: int = field(
        doc="Pipeline ranks per replica: one pod and one rank each, numbered as torchrun would (RANK, WORLD_SIZE, "
        "LOCAL_RANK 0, MASTER_ADDR, MASTER_PORT, and PET_* for torchrun).",
        minimum=1,
        maximum=1024,
    )
    args: list[str] = field(doc="Arguments of the command.", max_items=256, default_factory=list)
    image: str | None = field(
        doc="Image with the command, Python 3.11+ and torch; default spec.trainerImage.", max_length=1024, default=None
    )
    data_parallel: int = field(
        doc="Replicas of the pipeline: the job runs stages × dataParallel ranks.", minimum=1, maximum=65536, default=1
    )
    hook: bool = field(
        doc="Instrument the command's torch.distributed.pipelining schedules and announce their bubbles to the fill "
        "(the bubble hook, brought in by an init container of spec.trainerImage); false: the command runs as is and "
        "no bubble is announced.",
        default=True,
    )
    retry_exit_codes: list[int] = field(
        doc="Exit codes of the command that restart the gang from its checkpoints, added to "
        "spec.runPolicy.restartOnExitCodes. Default [1]: torchrun and an uncaught Python exception exit 1, also when "
        "a peer's death ended the rank; [] to fail the job on them.",
        max_items=64,
        default_factory=lambda: list(DEFAULT_RETRY_EXIT_CODES),
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        *(
            immutable(
                camel,
                path=f"spec.trainer.{camel}",
                why=WORLD_SIZE_FIXED,
            )
            for camel in ("stages", "dataParallel")
        ),
    )
