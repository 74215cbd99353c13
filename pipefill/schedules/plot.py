"""Timeline picture: ranks × time, actions coloured by kind and labelled by microbatch, bubbles hatched.

matplotlib is optional (the ``local`` extra); it is imported only when a picture is drawn.
"""

from __future__ import annotations

from pathlib import Path

from pipefill.schedules.timeline import Timeline

__all__ = ["plot_timeline"]

_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#55a868", "step-end": "#8172b3"}
_BUBBLE = {"warm-up": "#f2d0a4", "steady": "#e5e5e5", "cool-down": "#b9d7ea", "end-of-step": "#d9d2e9"}


def plot_timeline(
    timeline: Timeline, path: str | Path, *, title: str | None = None, time_unit: str = "s", dpi: int = 120
) -> Path:
    """Draw ``timeline`` into a PNG (or any format matplotlib infers from the suffix) at ``path``; returns the path.

    ``time_unit`` labels the time axis (``"s"``, or e.g. ``"units"`` for uniform costs).
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("drawing a timeline needs matplotlib: pip install 'pipefill-operator[local]'") from exc

    s = timeline.schedule
    n_ranks = s.num_ranks
    width = max(8.0, min(24.0, 0.4 * max(len(r.actions) for r in timeline.ranks)))
    fig = Figure(figsize=(width, 0.55 * n_ranks + 1.6))  # no pyplot: no global backend state
    ax = fig.subplots()
    step = timeline.step_s or 1.0
    for rt in timeline.ranks:
        y = rt.rank
        for b in rt.bubbles:
            ax.barh(
                y,
                b.duration_s,
                left=b.start_s,
                height=0.8,
                color=_BUBBLE[b.kind],
                hatch="///",
                edgecolor="#999999",
                linewidth=0.3,
            )
        for span in rt.actions:
            a = span.action
            ax.barh(
                y,
                span.duration_s,
                left=span.start_s,
                height=0.8,
                color=_COLOURS[a.kind.value],
                edgecolor="white",
                linewidth=0.5,
            )
            label = f"{a.mb_idx}" if s.virtual_stages == 1 else f"{a.stage_idx}:{a.mb_idx}"
            if span.duration_s / step * width * 0.85 >= len(label) * 0.06:  # inches available vs needed at 6 pt
                ax.text(
                    span.start_s + span.duration_s / 2, y, label, ha="center", va="center", fontsize=6, color="white"
                )
        if timeline.costs.step_end_s > 0:
            ax.barh(y, timeline.costs.step_end_s, left=rt.last_end_s, height=0.8, color=_COLOURS["step-end"])
    ax.set_yticks(range(n_ranks), [f"rank {r}" for r in range(n_ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, step)
    ax.set_xlabel(f"time in the step ({time_unit})")
    frac = timeline.bubble_fraction()
    ax.set_title(title or f"{s.name}: p={n_ranks}, m={s.num_microbatches}, v={s.virtual_stages} — bubbles {frac:.1%}")
    kinds = sorted({sp.action.kind.value for rt in timeline.ranks for sp in rt.actions}, key="FBIW".index)
    handles = [Patch(color=_COLOURS[k], label=k) for k in kinds]
    handles += [Patch(facecolor=c, hatch="///", edgecolor="#999999", label=f"bubble: {k}") for k, c in _BUBBLE.items()]
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(handles), fontsize=7, frameon=False
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi)
    return out
