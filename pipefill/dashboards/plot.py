"""Draw a dashboard as a PNG from Prometheus query results: the docs' pictures of what Grafana would show.

A real Grafana cannot run on the development machines, so ``docs/img/dashboard-*.png`` are drawn with matplotlib
from the same PromQL the dashboard JSON holds, evaluated by a real Prometheus (tests/dashboards). Panels keep their
grid positions; stat panels show the last value; time series show every series with Grafana's legend. Needs the
``local`` extra (matplotlib); the dashboard JSON is read as plain data, so no Grafana SDK either.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Result", "draw"]

Result = list[dict[str, Any]]
"""A Prometheus range-query result: ``[{"metric": {label: value}, "values": [[unix_s, "value"], ...]}, ...]``."""

_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_ROW_HEIGHT_IN = 0.32  # one grid row; Grafana's rows are ~30 px against ~67 px columns on a 1600 px screen
_WIDTH_IN = 16.0


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def _scale(unit: str) -> tuple[float, str]:
    """Multiplier and axis label for a Grafana unit."""
    return {
        "percentunit": (100.0, "%"),
        "s": (1.0, "seconds"),
        "bytes": (1.0 / 2**20, "MiB"),
    }.get(unit, (1.0, ""))


def _panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))


def draw(
    dashboard: Mapping[str, Any],
    results: Callable[[Mapping[str, Any], Mapping[str, Any]], Result],
    path: Path,
    *,
    start_s: float,
    subtitle: str,
    empty_reason: Callable[[Mapping[str, Any]], str],
) -> dict[int, int]:
    """Draw ``dashboard`` (its JSON as a dict) into ``path``. ``results(panel, target)`` evaluates one target;
    ``empty_reason(panel)`` says why a panel without data has none. Returns the series drawn per panel id."""
    from matplotlib.figure import Figure

    panels = _panels(dashboard)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height_in = rows * _ROW_HEIGHT_IN + 0.8
    # A fixed grid, not constrained layout: with many series in a panel's legend, constrained layout gives up
    # ("axes sizes collapsed to zero") and warns; the fixed spacing fits every panel's title and labels.
    fig = Figure(figsize=(_WIDTH_IN, height_in))
    fig.suptitle(f"{dashboard['title']}\n{subtitle}", fontsize=11)
    grid = fig.add_gridspec(
        rows, 24, left=0.04, right=0.99, bottom=0.02, top=1 - 0.7 / height_in, hspace=1.4, wspace=1.6
    )
    drawn: dict[int, int] = {}
    for panel in panels:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]])
        if panel["type"] == "row":
            ax.set_axis_off()
            ax.text(0, 0.5, panel["title"], fontsize=11, fontweight="bold", va="center")
            continue
        ax.set_title(panel["title"], fontsize=8, loc="left")
        ax.tick_params(labelsize=6)
        factor, ylabel = _scale(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
        count = 0
        for target in panel.get("targets", []):
            for series in results(panel, target):
                times = [float(t) - start_s for t, _ in series["values"]]
                values = [float(v) * factor for _, v in series["values"]]
                if panel["type"] == "stat":
                    ax.text(0.5, 0.45, f"{values[-1]:.3g} {ylabel}".strip(), fontsize=18, ha="center", va="center")
                else:
                    ax.plot(
                        times, values, linewidth=0.9, label=_legend(target.get("legendFormat", ""), series["metric"])
                    )
                count += 1
        drawn[panel["id"]] = count
        if count == 0:
            ax.text(0.5, 0.5, f"no data here: {empty_reason(panel)}", fontsize=7, ha="center", va="center", wrap=True)
        if panel["type"] == "stat" or count == 0:
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_ylabel(ylabel, fontsize=6)
        ax.set_xlabel("seconds since the run started", fontsize=6)
        ax.legend(fontsize=5, loc="upper left", ncol=2 if count > 6 else 1, frameon=False)
    fig.savefig(path, dpi=110)
    return drawn
