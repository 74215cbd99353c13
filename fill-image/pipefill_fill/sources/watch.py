"""The FillJobs of one namespace as the API server last said, kept current by a watch: no polling storm.

One background thread lists the FillJobs once (one request), then watches from that list's resourceVersion with
bookmarks (one long request, which the API server ends after ``watch_timeout_s``; the next watch resumes from the last
resourceVersion seen, a bookmark's included). A watch answered with 410 Gone (the resourceVersion is older than what
the API server keeps) starts over with a fresh list. An idle executor thus makes one request per ``watch_timeout_s``
(:data:`WATCH_TIMEOUT_S` by default), not one per poll; the executor reads the cache with no request at all. Errors (the API server
restarting, a network cut) are retried with a growing delay, up to ``max_backoff_s``, keeping the last good view.

The thread only reads and replaces whole objects under a lock; the executor's single working thread reads
:meth:`FillJobCache.objects` between bubbles and checks :meth:`FillJobCache.changed` after each one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from pipefill.spec import GROUP, VERSION

__all__ = ["PLURAL", "WATCH_TIMEOUT_S", "FillJobCache"]

log = logging.getLogger("pipefill_fill")

PLURAL = "filljobs"

WATCH_TIMEOUT_S = 300
"""Seconds one watch request lasts before the API server ends it and the next one starts: an idle executor's request
period (target: at most 2 requests a minute). The one default of the cache and of the Kubernetes work source."""


class FillJobCache:
    """name → FillJob object (as JSON), kept current by a list + watch loop in a daemon thread."""

    def __init__(
        self,
        api: client.CustomObjectsApi,
        namespace: str,
        *,
        label_selector: str = "",
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.api, self.namespace, self.label_selector = api, namespace, label_selector
        self.watch_timeout_s, self.max_backoff_s = watch_timeout_s, max_backoff_s
        self._objects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="filljob-watch", daemon=True)
        self._thread.start()

    def objects(self) -> list[dict[str, Any]]:
        """The FillJobs as last seen (empty until the first list answered); clears :meth:`changed`."""
        self._changed.clear()
        with self._lock:
            return list(self._objects.values())

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(name)

    def changed(self) -> bool:
        """Whether a FillJob changed since :meth:`objects` was last read (no request: a flag the watch sets)."""
        return self._changed.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait for the first list to be answered; whether it was."""
        return self._synced.wait(timeout_s)

    def wait_changed(self, timeout_s: float) -> bool:
        return self._changed.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # a connection already gone may raise anything; nothing to do
                response.shutdown()  # ends a watch blocked in a read (close() would wait for the read)
        self._thread.join(timeout=5.0)

    # -- the loop -------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff_s = 0.5
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                backoff_s = 0.5
            except ApiException as exc:
                if self._stop.is_set():
                    return
                log.warning("work source: FillJobs of %s: %s %s; retrying", self.namespace, exc.status, exc.reason)
                version = None if exc.status == 410 else version
                self._stop.wait(backoff_s)
                backoff_s = min(self.max_backoff_s, backoff_s * 2)
            except Exception as exc:  # connection errors of every kind: keep the view, retry
                if self._stop.is_set():
                    return
                log.warning("work source: watching FillJobs of %s failed (%s); retrying", self.namespace, exc)
                self._stop.wait(backoff_s)
                backoff_s = min(self.max_backoff_s, backoff_s * 2)

    def _list(self) -> str:
        listing = cast(
            dict[str, Any],
            self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=self.label_selector
            ),
        )
        with self._lock:
            self._objects = {o["metadata"]["name"]: o for o in listing.get("items", [])}
        self._synced.set()
        self._changed.set()
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        """One watch request from ``version``; returns the resourceVersion to resume from (None: list again)."""
        self._response = self.api.list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            label_selector=self.label_selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
        )
        try:
            for event in _events(self._response):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:  # too old: the API server no longer has that history
                        return None
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str(obj["metadata"]["resourceVersion"])
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                with self._lock:
                    if kind == "DELETED":
                        self._objects.pop(name, None)
                    else:
                        self._objects[name] = obj
                self._changed.set()
        finally:
            self._response.release_conn()
            self._response = None
        return version


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
        yield cast(dict[str, Any], json.loads(line))
