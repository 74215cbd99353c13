"""Pipeline schedules and the timeline simulator (torch-free).

- :func:`build_schedule` makes a :class:`Schedule` (per-rank ordered :class:`Action` s plus the stage → rank
  placement) for ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zero-bubble-h1``, ``zbv``, or ``custom`` (torch's
  compute-only CSV, read by :func:`load_csv`, written by :func:`dump_csv`); :func:`validate_schedule` rejects
  schedules that cannot run, naming the first stuck action.
- :func:`simulate` turns a schedule and :class:`Costs` (plus an optional :class:`MemoryModel`) into a
  :class:`Timeline`: start and end of every action, and every rank's bubbles (:class:`BubbleSpan`).
- :func:`project_fill` estimates how much of a fill workload (:class:`FillProfile`) the bubbles hold, in whole
  steps or in pieces.
- ``pipefill.schedules.trace.chrome_trace`` renders a timeline for Perfetto; ``pipefill.schedules.plot.plot_timeline``
  draws it (needs matplotlib).
"""

from pipefill.schedules.costs import Costs
from pipefill.schedules.csvio import dump_csv, load_csv
from pipefill.schedules.fill import FILL_STEPS, BubbleFill, FillProfile, FillProjection, project_fill
from pipefill.schedules.generators import SCHEDULE_NAMES, ScheduleRuleError, build_schedule, canonical_name
from pipefill.schedules.memory import MemoryModel
from pipefill.schedules.model import Action, Kind, Schedule, ScheduleError, looped_placement, v_placement
from pipefill.schedules.simulate import simulate
from pipefill.schedules.timeline import BUBBLE_KINDS, ActionSpan, BubbleSpan, RankTimeline, Timeline
from pipefill.schedules.validate import validate_schedule

__all__ = [
    "BUBBLE_KINDS",
    "FILL_STEPS",
    "SCHEDULE_NAMES",
    "Action",
    "ActionSpan",
    "BubbleFill",
    "BubbleSpan",
    "Costs",
    "FillProfile",
    "FillProjection",
    "Kind",
    "MemoryModel",
    "RankTimeline",
    "Schedule",
    "ScheduleError",
    "ScheduleRuleError",
    "Timeline",
    "build_schedule",
    "canonical_name",
    "dump_csv",
    "load_csv",
    "looped_placement",
    "project_fill",
    "simulate",
    "v_placement",
    "validate_schedule",
]
