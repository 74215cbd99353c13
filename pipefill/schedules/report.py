"""Plain-text report of a timeline: per rank, its bubbles by kind with durations and free memory."""

from __future__ import annotations

from pipefill.schedules.fill import FillProjection
from pipefill.schedules.timeline import BUBBLE_KINDS, BubbleSpan, Timeline

__all__ = ["format_report"]

_GIB = 1 << 30


def _time(value: float, units: str) -> str:
    if units != "s":
        return f"{value:.3g}"
    if value >= 1:
        return f"{value:.3f} s"
    return f"{value * 1e3:.3f} ms"


def _free(bubbles: list[BubbleSpan]) -> str:
    free = [b.free_bytes for b in bubbles if b.free_bytes is not None]
    return f"{min(free) / _GIB:.1f} GiB" if free else "-"


def format_report(timeline: Timeline, fill: FillProjection | None = None, *, units: str = "s") -> str:
    """The ``pipefill simulate`` table. ``units="s"`` prints seconds/milliseconds; anything else bare numbers."""
    s = timeline.schedule
    unit_note = "" if units == "s" else f" (time in {units})"
    lines = [
        f"schedule {s.name}: {s.num_ranks} ranks, {s.num_stages} stages (v={s.virtual_stages}, "
        f"{s.placement_style}), {s.num_microbatches} microbatches{unit_note}",
        f"step {_time(timeline.step_s, units)}; bubble fraction {timeline.bubble_fraction():.1%} (idle ÷ step, mean "
        "over ranks)",
        "",
        f"{'rank':>4}  {'kind':<12} {'count':>5} {'total':>12} {'longest':>12} {'fraction':>8}  {'min free':>9}",
    ]
    for rt in timeline.ranks:
        bubbles = list(rt.bubbles)
        rows: list[tuple[str, list[BubbleSpan]]] = [("all", bubbles)]
        rows += [(k, [b for b in bubbles if b.kind == k]) for k in BUBBLE_KINDS]
        for kind, group in rows:
            if kind != "all" and not group:
                continue
            total = sum(b.duration_s for b in group)
            longest = max((b.duration_s for b in group), default=0.0)
            frac = total / timeline.step_s if timeline.step_s > 0 else 0.0
            lines.append(
                f"{rt.rank if kind == 'all' else '':>4}  {kind:<12} {len(group):>5} {_time(total, units):>12} "
                f"{_time(longest, units):>12} {frac:>8.1%}  {_free(group):>9}"
            )
    if fill is not None:
        lines += [
            "",
            f"fill workload {fill.profile.name} in {'pieces' if fill.steps == 'pieces' else 'whole steps'}: "
            f"{fill.samples_per_step:.6g} samples per step, "
            f"{fill.samples_per_s:.1f} samples/s per pipeline; uses {fill.bubble_use:.1%} of the bubble time; "
            f"utilization gain {fill.utilization_gain:+.1%} (fill seconds ÷ training seconds)",
        ]
    return "\n".join(lines)
