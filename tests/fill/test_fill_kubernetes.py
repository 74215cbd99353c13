"""The Kubernetes work source against the real API server, as the fill executor's ServiceAccount (its exact RBAC):
what it offers (planned, assigned to its pod uid, not cancelled, suspended or final), the epoch check of an
assignment that moved, status reports merged with the resourceVersion precondition under real conflicts, and the
request rate of an idle executor counted in the API server's audit log."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from kube_helpers import (
    PausableProxy,
    admin,
    api_as,
    api_through,
    assign,
    create_filljob,
    executor_account,
    get_status,
    plan,
    upstream_of,
    write_status,
)
from waiting import wait_for

from pipefill.devcluster import ControlPlane
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import SliceProgress
from pipefill_fill.sources import Identity, ProgressReport
from pipefill_fill.sources.kubernetes import KubernetesSource
from pipefill_fill.sources.watch import WATCH_TIMEOUT_S
from pipefill_fill.work import Slice

pytestmark = pytest.mark.cluster

ME = Identity("gpt", 0, pod="gpt-0-0", pod_uid="uid-0")


def _source(cp: ControlPlane, namespace: str, identity: Identity = ME, **kw: Any) -> KubernetesSource:
    source = KubernetesSource(identity=identity, namespace=namespace, api=api_as(executor_account(cp, namespace)), **kw)
    assert source.cache.wait_synced(30)
    return source


def _settle(source: KubernetesSource, check: Any, what: str) -> None:
    """Wait (on the watch's own change events) until ``check()`` holds."""

    def changed(left_s: float) -> None:
        source.cache.wait_changed(min(left_s, 1.0))
        source.poll()

    wait_for(check, f"the watch to show {what}", 30, pause=changed)


def test_offers_planned_jobs_assigned_to_its_pod(
    control_plane: ControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pipefill_fill")
    api = admin(control_plane)
    for name in ("mine", "unplanned", "other-pod", "finished", "cancelled", "suspended"):
        create_filljob(api, namespace, name, output=f"/data/{name}", total=256, ranks=2)
    control_plane.kubectl(
        "patch", "filljob", "cancelled", "-n", namespace, "--type=merge", "-p", '{"spec":{"cancel":true}}'
    )
    control_plane.kubectl(
        "patch", "filljob", "suspended", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    def scheduled(status: dict[str, Any], uid: str = "uid-0", phase: str = "Running") -> None:
        plan(status, 256, 2)
        assign(status, start=64, end=128, pod="p", uid=uid)
        status["phase"] = phase

    write_status(api, namespace, "mine", scheduled)
    write_status(api, namespace, "unplanned", lambda s: assign(s, start=0, end=64, pod="p", uid="uid-0"))
    write_status(api, namespace, "other-pod", lambda s: scheduled(s, uid="uid-1"))
    write_status(api, namespace, "finished", lambda s: scheduled(s, phase="Succeeded"))
    write_status(api, namespace, "cancelled", scheduled)
    write_status(api, namespace, "suspended", scheduled)
    source = _source(control_plane, namespace)
    try:
        _settle(source, lambda: [s.name for s in source.poll()] == ["mine"], "only the job assigned here")
        (spec,) = source.poll()
        assert spec.plan == tuple(Slice(64 * i, 64 * i + 64) for i in range(4))  # the plan of record, as written
        # its slice finished here and still assigned (the operator moves it once it sees the status): an idle executor
        # asks at every bubble, and says why nothing is claimed once
        assert [source.claim(spec, [Slice(0, 64), Slice(128, 192)]) for _ in range(3)] == [None, None, None]
        assert caplog.text.count("none of its unfinished ones ([0, 64), [128, 192))") == 1
        assert source.claim(spec, [Slice(0, 64), Slice(64, 128)]) == Slice(64, 128)
        assert source.epoch("mine", Slice(64, 128)) == 1 and source.revoked("mine", Slice(64, 128), 1) is None
    finally:
        source.close()


def test_a_moved_slice_is_revoked_and_cancel_stops_offering(control_plane: ControlPlane, namespace: str) -> None:
    api = admin(control_plane)
    create_filljob(api, namespace, "j", output="/data/j", total=256, ranks=2)
    write_status(api, namespace, "j", lambda s: (plan(s, 256, 2), assign(s, start=0, end=64, pod="p0", uid="uid-0")))
    source = _source(control_plane, namespace)
    try:
        _settle(source, lambda: bool(source.poll()), "the assigned job")
        (spec,) = source.poll()
        assert source.claim(spec, [Slice(0, 64)]) == Slice(0, 64)
        write_status(api, namespace, "j", lambda s: assign(s, start=0, end=64, pod="p1", uid="uid-1"))  # moved
        _settle(source, lambda: source.revoked("j", Slice(0, 64), 1) is not None, "the move")
        assert source.revoked("j", Slice(0, 64), 1) == "its assignment at epoch 1 is gone (now epoch 2 on pod p1)"
        assert source.poll() == []
        write_status(api, namespace, "j", lambda s: assign(s, start=0, end=64, pod="p0", uid="uid-0"))  # back, epoch 3
        _settle(source, lambda: source.revoked("j", Slice(0, 64), 3) is None, "the new assignment")
        assert source.revoked("j", Slice(0, 64), 1) is not None  # the old epoch stays refused
        control_plane.kubectl(
            "patch", "filljob", "j", "-n", namespace, "--type=merge", "-p", '{"spec":{"cancel":true}}'
        )
        _settle(source, lambda: source.revoked("j", Slice(0, 64), 3) is not None, "the cancel")
        assert source.revoked("j", Slice(0, 64), 3) == "the FillJob was cancelled (spec.cancel)" and source.poll() == []
    finally:
        source.close()


def test_reports_merge_under_conflicts(control_plane: ControlPlane, namespace: str) -> None:
    """Four executors report the same job at once (each its own client and slice); every pointer ends at the highest
    value reported, nothing the operator wrote is lost, and the PATCHes that raced were refused and merged again."""
    api = admin(control_plane)
    create_filljob(api, namespace, "j", output="/data/j", total=256, ranks=4)
    write_status(api, namespace, "j", lambda s: (plan(s, 256, 4), assign(s, start=0, end=64, pod="p", uid="u")))
    before = get_status(api, namespace, "j")
    sources = [_source(control_plane, namespace, Identity("gpt", r, pod_uid=f"uid-{r}")) for r in range(4)]
    go = threading.Barrier(4)

    def report(r: int) -> None:
        go.wait()
        for i in range(1, 17):
            pointer = SliceProgress(64 * r, 64 * r + 64, 64 * r + i)
            sources[r].report("j", ProgressReport(FillJobPhase.RUNNING, 0, 256, slices=(pointer,)))
            assert sources[r].flush(30)  # one PATCH per report: the writers race as often as before the queue

    threads = [threading.Thread(target=report, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sources:
        s.close()
    status = get_status(api, namespace, "j")
    assert [s["committed"] - s["start"] for s in status["slices"]] == [16] * 4
    # samplesDone and progress are the queue's, summed from the pointers (STATUS_WRITERS): no executor writes them
    assert (status.get("samplesDone"), status.get("progress")) == (before.get("samplesDone"), before.get("progress"))
    assert status["assignments"] == before["assignments"] and status["epoch"] == before["epoch"]
    conflicts = [
        e
        for e in control_plane.audit_events()
        if e.get("verb") == "patch"
        and f"/namespaces/{namespace}/filljobs/j/status" in str(e.get("requestURI"))
        and (e.get("responseStatus") or {}).get("code") == 409  # type: ignore[union-attr]
    ]
    assert conflicts, "four concurrent writers never raced: the test proves nothing"


def test_an_idle_executor_makes_one_request_per_watch_period_of_at_least_30_s(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Target ≤ 2 requests per idle executor per minute: after start-up (one list, one watch), idling costs one request
    per watch period however often the executor polls, and the period is :data:`WATCH_TIMEOUT_S` (at least 30 s) by
    default; a change made meanwhile is still seen at once, and so is one after the watch was renewed (the watch is
    live, not asleep). Run with a 3 s period: three periods of idling take 9 s, not the 30 s of the default's one."""
    assert WATCH_TIMEOUT_S >= 30, (
        f"WATCH_TIMEOUT_S={WATCH_TIMEOUT_S}: an idle executor would ask more than twice a minute"
    )
    period_s = 3
    api = admin(control_plane)
    create_filljob(api, namespace, "j", output="/data/j", total=256, ranks=2)
    t_created = time.monotonic()  # the first watch starts after this: its renewals come at most every period_s since
    source = _source(control_plane, namespace, watch_timeout_s=period_s)
    user = f"system:serviceaccount:{namespace}:fill"

    def requests() -> set[str]:
        return {
            str(e["auditID"])
            for e in control_plane.audit_events()
            if (e.get("user") or {}).get("username") == user  # type: ignore[union-attr]
        }

    try:
        source.poll()
        start = requests()
        assert 1 <= len(start) <= 3  # the list and the watch (a token review is not the executor's)
        t0 = time.monotonic()
        write_status(api, namespace, "j", lambda s: (plan(s, 256, 2), assign(s, start=0, end=64, pod="p", uid="uid-0")))
        _settle(source, lambda: bool(source.poll()), "the assignment made while idle")
        polls = 0
        while time.monotonic() - t0 < 3 * period_s + 0.5:  # an executor between bubbles: it polls, often
            source.poll()
            polls += 1
            source.cache.wait_changed(0.05)
        t_end = time.monotonic()
        made = requests()
        renewals = int((t_end - t_created) // period_s)  # watches the API server ended by t_end, each renewed once
        assert 3 <= len(made) <= 2 + renewals, (
            f"{len(made) - len(start)} API requests in {t_end - t0:.1f} s of idling with {polls} polls and a watch "
            f"period of {period_s} s, {len(made)} since start-up: expected the list, the first watch and one renewal "
            f"per period (at most {renewals}, at least one)"
        )
        create_filljob(api, namespace, "k", output="/data/k", total=256, ranks=2)
        write_status(api, namespace, "k", lambda s: (plan(s, 256, 2), assign(s, start=0, end=64, pod="p", uid="uid-0")))
        _settle(source, lambda: {t.name for t in source.poll()} == {"j", "k"}, "a job assigned after the renewals")
    finally:
        source.close()


def test_a_hung_api_server_never_delays_a_report_and_it_lands_once_the_server_answers(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The filling thread's report returns at once while the API server (behind a proxy that holds every connection)
    answers nothing; the report is kept, tried again, and in the status once the server answers."""
    api = admin(control_plane)
    create_filljob(api, namespace, "j", output="/data/j", total=256, ranks=2)
    write_status(api, namespace, "j", lambda s: (plan(s, 256, 2), assign(s, start=0, end=64, pod="p", uid="uid-0")))
    starts = [s["committed"] for s in get_status(api, namespace, "j")["slices"]]
    kubeconfig = executor_account(control_plane, namespace)
    proxy = PausableProxy(*upstream_of(kubeconfig))
    proxy.pause()
    source = KubernetesSource(
        identity=ME, namespace=namespace, api=api_through(kubeconfig, proxy), request_timeout_s=(0.5, 0.5)
    )
    try:
        for committed in (16, 32):  # two reports while the server hangs: kept in order, sent together
            t0 = time.monotonic()
            pointer = SliceProgress(0, 64, committed)
            source.report("j", ProgressReport(FillJobPhase.RUNNING, 0, 256, slices=(pointer,)))
            assert time.monotonic() - t0 < 0.05, "report() waited for the API server"
        assert not source.flush(1.5)  # nothing answers: still queued (tried, timed out, kept)
        assert [s["committed"] for s in get_status(api, namespace, "j")["slices"]] == starts
        assert proxy.held, "the proxy held no connection: the report never tried the server"
        proxy.resume()
        assert source.flush(30), "the kept reports were not sent once the server answered"
        assert [s["committed"] for s in get_status(api, namespace, "j")["slices"]] == [32, *starts[1:]]
    finally:
        source.close()
        proxy.close()
