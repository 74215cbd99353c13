"""The lifecycle of a PipelineTrainingJob as pure functions, shared by the operator and ``pipefill local``.

``exitcodes`` classifies a trainer's exit the same way on both runners; ``observe`` reads a rank pod's status;
``gang`` decides the next status and actions of the whole gang (``sidecars``: when a fill executor that exited starts
again where nobody else restarts it; ``images``: which containers cannot start); ``checks`` finds what admission
cannot; ``volumes`` names the user's objects the pods mount and which are missing; and ``conditions`` keeps
metav1-style conditions. Nothing here talks to the API server or starts a process.
"""

from pipefill.lifecycle.exitcodes import ExitClass, classify, exit_code, exit_text
from pipefill.lifecycle.gang import Decision, Event, Observed, decide
from pipefill.lifecycle.observe import FillExit, PodView, Termination, observe_pod

__all__ = [
    "Decision",
    "Event",
    "ExitClass",
    "FillExit",
    "Observed",
    "PodView",
    "Termination",
    "classify",
    "decide",
    "exit_code",
    "exit_text",
    "observe_pod",
]
