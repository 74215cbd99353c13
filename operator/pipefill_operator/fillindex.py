"""What the fill queue knows of the cluster: FillJobs, training jobs and rank pods as the watches last showed them
(the operator's :class:`~pipefill_operator.cache.ClusterCache`), and the :class:`~pipefill.queue.Snapshot` one
scheduling pass decides from.

The safety of reassignment rests on the cache's rule that a pod is gone only when the API server says so, and the
loop passes only after the cache listed every kind once: before that an absent pod means "not seen yet".
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from pipefill.pods import GENERATION_LABEL, RANK_LABEL
from pipefill.queue import FillJobView, RankView, Snapshot, TrainingJobView
from pipefill.queue.fromstatus import RankBubbles, reported_bubbles, status_fields
from pipefill.spec import FillJob, PipelineTrainingJob, parse
from pipefill_operator.cache import ObjectIndex, PodIndex

__all__ = ["FillIndex"]

log = logging.getLogger("pipefill_operator.fill")


def _unix_s(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class FillIndex:
    """FillJobs, PipelineTrainingJobs and rank pods; parsed specs cached by (uid, generation)."""

    def __init__(
        self,
        *,
        fill_jobs: ObjectIndex | None = None,
        training_jobs: ObjectIndex | None = None,
        pods: PodIndex | None = None,
    ) -> None:
        self.fill_jobs = fill_jobs if fill_jobs is not None else ObjectIndex()
        self.training_jobs = training_jobs if training_jobs is not None else ObjectIndex()
        self.pods = pods if pods is not None else PodIndex()
        self._parsed: dict[tuple[str, int], Any] = {}
        self.invalid: dict[tuple[str, str], str] = {}  # FillJobs whose spec does not parse -> why (logged once)
        self.schedule_csvs: dict[tuple[str, str], str] = {}  # custom schedules of training jobs (their reconciles')

    def _parse(self, body: dict[str, Any]) -> Any:
        meta = body["metadata"]
        mark = (str(meta["uid"]), int(meta.get("generation") or 1))
        if mark not in self._parsed:
            obj: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
            self._parsed = {k: v for k, v in self._parsed.items() if k[0] != mark[0]}
            self._parsed[mark] = parse(obj, source=f"{meta.get('namespace')}/{meta.get('name')}")
        return self._parsed[mark]

    def fill_job_bodies(self) -> list[dict[str, Any]]:
        return sorted(
            self.fill_jobs.objects.values(), key=lambda b: (b["metadata"]["namespace"], b["metadata"]["name"])
        )

    def snapshot(self, *, suspended: set[tuple[str, str]]) -> Snapshot:
        """The pass's input. FillJobs in ``suspended`` (suspended or cancelled: they hold nothing) are given a
        phase the pass treats as inactive, so their placements come back as released."""
        live = self.fill_jobs.objects.keys() | self.training_jobs.objects.keys()
        if len(self._parsed) > len(live):  # specs of deleted objects
            self._parsed = {k: v for k, v in self._parsed.items() if k[0] in live}
        jobs = {
            (str(b["metadata"]["namespace"]), str(b["metadata"]["name"])) for b in self.training_jobs.objects.values()
        }
        for gone in [k for k in self.schedule_csvs if k not in jobs]:
            del self.schedule_csvs[gone]
        bubbles = self._reported_bubbles()
        views: list[FillJobView] = []
        for body in self.fill_job_bodies():
            view = self._fill_view(body, suspended)
            if view is not None:
                views.append(view)
        tjs: list[TrainingJobView] = []
        listed: set[str] = set()
        for body in self.training_jobs.objects.values():
            try:
                tj = self._training_view(body, bubbles)
            except (ValueError, KeyError, TypeError) as exc:  # e.g. two Running pods claiming one rank
                log.warning("fill queue: PipelineTrainingJob %s/%s hosts nothing this pass: %s",
                            body["metadata"].get("namespace"), body["metadata"].get("name"), exc)  # fmt: skip
                continue
            if tj is not None:
                tjs.append(tj)
                listed.update(r.pod_uid for r in tj.ranks)
        others = frozenset(uid for uid in self.pods.objects if uid not in listed)
        return Snapshot(tuple(views), tuple(tjs), others)

    def _fill_view(self, body: dict[str, Any], suspended: set[tuple[str, str]]) -> FillJobView | None:
        meta, status = body["metadata"], body.get("status") or {}
        key = (str(meta["namespace"]), str(meta["name"]))
        try:
            job = self._parse(body)
            if not isinstance(job, FillJob):
                raise ValueError(f"expected a FillJob, got {body.get('kind')}")
            phase = str(status.get("phase") or "Queued")
            view = FillJobView.from_spec(
                job,
                namespace=key[0],
                created_unix_s=_unix_s(meta.get("creationTimestamp")) or 0.0,
                deadline_unix_s=_unix_s(job.spec.deadline),
                phase="Suspended" if key in suspended and phase not in ("Succeeded", "Failed", "Cancelled") else phase,
                epoch=int(status.get("epoch") or 0),
                **status_fields(key[1], status),
            )
        except (ValueError, KeyError, TypeError) as exc:  # SpecError is a ValueError
            if key not in self.invalid:
                log.warning("fill queue: FillJob %s/%s left out of the queue: %s", *key, exc)
            self.invalid[key] = str(exc)
            return None
        self.invalid.pop(key, None)
        return view

    def _training_view(
        self,
        body: dict[str, Any],
        bubbles: RankBubbles,
    ) -> TrainingJobView | None:
        meta, status = body["metadata"], body.get("status") or {}
        namespace, name = str(meta["namespace"]), str(meta["name"])
        try:
            job = self._parse(body)
        except ValueError:
            return None  # the reconciler reports it (InvalidSpec); it hosts nothing
        if not isinstance(job, PipelineTrainingJob):
            return None
        running = status.get("phase") == "Running" and not job.spec.run_policy.suspend
        generation = str(status.get("generation") or 0)
        ranks: list[RankView] = []
        for pod in self.pods.pods_of((namespace, name)):
            pmeta = pod["metadata"]
            labels = pmeta.get("labels") or {}
            if (
                not running
                or labels.get(GENERATION_LABEL) != generation
                or pmeta.get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") != "Running"
                or not any(ref.get("uid") == meta["uid"] for ref in pmeta.get("ownerReferences") or ())
            ):
                continue
            rank = int(labels.get(RANK_LABEL, -1))
            classes, step_s = bubbles.get((namespace, name, rank), ((), None))
            ranks.append(RankView(rank, str(pmeta["name"]), str(pmeta["uid"]), classes, step_s))
        return TrainingJobView.from_spec(
            job,
            ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
            namespace=namespace,
            running=running,
            schedule_csv=self.schedule_csvs.get((namespace, name)),
        )

    def _reported_bubbles(self) -> RankBubbles:
        """Bubble classes per (namespace, training job, rank) as executors reported them in any FillJob's status
        (the first FillJob by name that has a report, so the choice is deterministic)."""
        return reported_bubbles(
            (str(b["metadata"]["namespace"]), b.get("status") or {}) for b in self.fill_job_bodies()
        )
