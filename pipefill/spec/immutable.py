"""Update-only CEL rules (``oldSelf``): what of a stored object may not change, and what to do instead.

A PipelineTrainingJob's spec may be edited while it runs: most fields are taken by the next gang (the operator says
so with the SpecChangePending condition and an Event) or at once. A few cannot be taken at all, and the API server
refuses an edit of them with a message naming the field, why, and what to do instead; the decision, field by field,
is in docs/operator.md ("Changing a running job").
"""

from __future__ import annotations

from pipefill.spec._schema import Rule

__all__ = ["RECREATE", "WORLD_SIZE_FIXED", "immutable", "same"]

RECREATE = "delete the job and create it again"
"""what to do instead, for most"""
WORLD_SIZE_FIXED = (
    "the job's pods (stages × dataParallel) size its PodGroup and PodDisruptionBudget, made when it first starts"
)
"""why a job's rank layout is immutable"""


def same(camel: str) -> str:
    """CEL: field ``camel`` of ``self`` equals the stored one's, both unset counting as equal."""
    return f"has(self.{camel}) == has(oldSelf.{camel}) && (!has(self.{camel}) || self.{camel} == oldSelf.{camel})"


def immutable(camel: str, *, path: str, why: str, instead: str = RECREATE, when: str | None = None) -> Rule:
    """The rule that field ``camel`` (``path`` in messages) keeps its stored value; ``when``: CEL of ``self`` under
    which it holds (else always)."""
    rule = same(camel)
    if when is not None:
        rule = f"!({when}) || ({rule})"
    return Rule(rule=rule, message=f"{path} is immutable: {why}; {instead}", field_path=f".{camel}")
