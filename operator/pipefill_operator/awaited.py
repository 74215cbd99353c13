"""Watches of the objects that waiting jobs need, and of nothing else.

A job can wait for an object its spec names: the ConfigMap of its custom schedule, its checkpoint claim. Watching
every ConfigMap and claim of the cluster for that would have the operator list and follow objects it never reads
(a large cluster has tens of thousands, and controllers that update theirs every few seconds). Instead, each awaited
object gets a watch of its own (``fieldSelector=metadata.name=…`` in its namespace) while some job waits for it: a
list of that one name first, then a watch from the list's resourceVersion. The jobs wake when the object differs
from the version their reconcile saw (absent, or present without what they need) and at every change after that;
the watch ends once no job waits for it. A watch that fails is started again after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Set

from pipefill_operator.kube import ApiError, Kube, resource_of

__all__ = ["AwaitedObjects", "ObjectRef"]

log = logging.getLogger("pipefill_operator")

ObjectRef = tuple[str, str, str]  # (kind of the core group, namespace, name)


class AwaitedObjects:
    """One watch per awaited object; ``on_change(kind, namespace, name)`` is called on the event loop."""

    def __init__(
        self,
        kube: Kube,
        on_change: Callable[[str, str, str], None],
        *,
        seen: Mapping[ObjectRef, str | None],
        timeout_s: int = 300,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.kube, self.on_change = kube, on_change
        self.seen = seen  # the resourceVersion each object had when a reconcile last read it (None: absent)
        self.timeout_s, self.max_backoff_s = timeout_s, max_backoff_s
        self._tasks: dict[ObjectRef, asyncio.Task[None]] = {}

    @property
    def watched(self) -> Set[ObjectRef]:
        return self._tasks.keys()

    def sync(self, waiting_for: Mapping[ObjectRef, Set[object]]) -> None:
        """Watch exactly the objects some job waits for."""
        wanted = {ref for ref, waiters in waiting_for.items() if waiters}
        for ref in [r for r in self._tasks if r not in wanted]:
            self._tasks.pop(ref).cancel()
        for ref in wanted - self._tasks.keys():
            self._tasks[ref] = asyncio.create_task(self._follow(ref), name=f"await-{'/'.join(ref)}")

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, ref: ObjectRef) -> None:
        kind, namespace, name = ref
        res = resource_of("v1", kind)
        selector = f"metadata.name={name}"
        known = self.seen.get(ref)  # the object's version as last seen, by a reconcile or by this watch
        version: str | None = None  # where the watch goes on from; None: list first
        backoff_s = 0.5
        while True:
            try:
                if version is None:
                    listed = await self.kube.request("GET", res.path(namespace), params={"fieldSelector": selector})
                    items = listed.get("items") or []
                    now = str(items[0]["metadata"]["resourceVersion"]) if items else None
                    if now is not None and now != known:
                        known = now
                        self.on_change(*ref)
                    version = str(listed["metadata"]["resourceVersion"])
                async for event in self.kube.watch(
                    res, namespace, field_selector=selector, resource_version=version, timeout_s=self.timeout_s
                ):
                    version = str(event["object"]["metadata"]["resourceVersion"])
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        known = version
                        self.on_change(*ref)
                backoff_s = 0.5  # the server ended the watch (its timeout): go on from the last version
            except ApiError as exc:
                version = None  # list again: the version may be too old to watch from (410 Gone), or lost
                if exc.status != 410:
                    log.warning("watch of %s %s/%s: %s; again in %.1f s", kind, namespace, name, exc, backoff_s)
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(2 * backoff_s, self.max_backoff_s)
