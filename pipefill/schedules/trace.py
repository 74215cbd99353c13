"""Chrome/Perfetto trace of a timeline: one track per rank, actions and bubbles as complete ("X") events.

Open the file in https://ui.perfetto.dev or chrome://tracing. Times are microseconds from the step start.
"""

from __future__ import annotations

from typing import Any

from pipefill.schedules.timeline import Timeline

__all__ = ["chrome_trace"]

_US_PER_S = 1e6


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    s = timeline.schedule
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"pipeline ({s.name}, m={s.num_microbatches})"}}
    ]
    for rt in timeline.ranks:
        stages = ",".join(map(str, rt.stages))
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": rt.rank,
                "args": {"name": f"rank {rt.rank} (stages {stages})"},
            }
        )
        for idx, span in enumerate(rt.actions):
            a = span.action
            events.append(
                {
                    "name": str(a),
                    "cat": a.kind.value,
                    "ph": "X",
                    "pid": 0,
                    "tid": rt.rank,
                    "ts": span.start_s * _US_PER_S,
                    "dur": span.duration_s * _US_PER_S,
                    "args": {"stage_idx": a.stage_idx, "mb_idx": a.mb_idx, "action_idx": idx},
                }
            )
        if timeline.costs.step_end_s > 0:
            events.append(
                {
                    "name": "step end (all-reduce + optimizer)",
                    "cat": "step-end",
                    "ph": "X",
                    "pid": 0,
                    "tid": rt.rank,
                    "ts": rt.last_end_s * _US_PER_S,
                    "dur": timeline.costs.step_end_s * _US_PER_S,
                }
            )
        for b in rt.bubbles:
            events.append(
                {
                    "name": f"bubble ({b.kind})",
                    "cat": "bubble",
                    "ph": "X",
                    "pid": 0,
                    "tid": rt.rank,
                    "ts": b.start_s * _US_PER_S,
                    "dur": b.duration_s * _US_PER_S,
                    "cname": "grey",
                    "args": {
                        "free_bytes": b.free_bytes,
                        "in_flight_mbs": b.in_flight_mbs,
                        "before_action_idx": b.before_action_idx,
                    },
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"step_s": timeline.step_s}}
