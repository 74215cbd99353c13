"""The FillJob queue (torch-free, no cluster client): the slice plan of record, the status merge, and the scheduling
pass that places slices on rank pods by policy.

- :func:`plan_slices` / :class:`Slice`: the one plan both the operator and the executors use.
- :func:`merged_status`: how several executors' progress reports merge into one FillJob status.
- :func:`schedule_pass`: one pass over a :class:`Snapshot` (FillJobs, training jobs' rank pods, live pods) by one of
  :data:`POLICIES` → :class:`PassResult` (per job: placements with epochs, or the reason it waits).
"""

from pipefill.queue.policies import POLICIES, Policy
from pipefill.queue.scheduler import JobOutcome, PassResult, schedule_pass
from pipefill.queue.slices import MAX_SLICES, MIN_SLICE_UNITS, SLICES_PER_RANK, Slice, check_plan, plan_slices
from pipefill.queue.snapshot import (
    FillJobView,
    Placement,
    RankView,
    SliceStatus,
    Snapshot,
    TrainingJobView,
    Unfit,
)
from pipefill.queue.status import (
    FINAL_PHASES,
    OUTPUTS_FILE,
    Identity,
    ProgressReport,
    merged_status,
    now_rfc3339,
    output_report,
    plan_of_record,
)
from pipefill.spec import FillJobPhase

__all__ = [
    "FINAL_PHASES",
    "MAX_SLICES",
    "MIN_SLICE_UNITS",
    "OUTPUTS_FILE",
    "POLICIES",
    "SLICES_PER_RANK",
    "FillJobPhase",
    "FillJobView",
    "Identity",
    "JobOutcome",
    "PassResult",
    "Placement",
    "Policy",
    "ProgressReport",
    "RankView",
    "Slice",
    "SliceStatus",
    "Snapshot",
    "TrainingJobView",
    "Unfit",
    "check_plan",
    "merged_status",
    "now_rfc3339",
    "output_report",
    "plan_of_record",
    "plan_slices",
    "schedule_pass",
]
