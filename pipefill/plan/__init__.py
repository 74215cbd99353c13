"""The execution planner (torch-free): which batch size, how many steps per bubble, and which job in which bubble."""

from pipefill.plan.assign import Assignment, JobProfile, assign_jobs
from pipefill.plan.bulk import samples_per_bubble
from pipefill.plan.classes import BubbleLike, ObservedBubble, classes_from_bubbles
from pipefill.plan.pieces import PiecePlan, plan_pieces
from pipefill.plan.planner import BubbleClass, ClassPlan, JobPlan, ProfilePoint, plan_class, plan_job

__all__ = [
    "Assignment",
    "BubbleClass",
    "BubbleLike",
    "ClassPlan",
    "JobPlan",
    "JobProfile",
    "ObservedBubble",
    "PiecePlan",
    "ProfilePoint",
    "assign_jobs",
    "classes_from_bubbles",
    "plan_class",
    "plan_job",
    "plan_pieces",
    "samples_per_bubble",
]
