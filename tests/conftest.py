"""Session-wide fixtures: the real control plane for tests marked ``cluster``.

One control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok GPU nodes) per test session,
in a temporary directory on free loopback ports; each test gets a fresh namespace. With ``CI=true`` a missing binary
or a failed start fails the run (it must never skip there); elsewhere those tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sharing import SHARING_DIR, files_in_run_order, kind_of, share_the_machine

from pipefill.devcluster import BinaryMissing, ControlPlane, StartFailed, start

_IN_CI = os.environ.get("CI", "").lower() == "true"

# The start-up variables of pipefill local's children (pipefill/local/launcher.py, child_environment) for every child
# of the tests: a `pipefill local` forked from the tests' launcher (tests/launched.py) then forks its own launcher from
# itself rather than import torch again in a new one (pipefill/local/forker.py). `make test` sets the second already.
os.environ.setdefault("PYTHONUNBUFFERED", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A shell that starts the tests in the background without job control (`make test &` in a script, nohup) leaves SIGINT
# ignored, and every child inherits that: the tests' Ctrl-C to `pipefill local` would then be lost and its processes
# left running. Handled here, the children start with the default action again (exec resets a handled signal).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_outcomes: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0}


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        cp = start(tmp_path_factory.mktemp("control-plane"), nodes=4)
    except (BinaryMissing, StartFailed) as exc:
        if _IN_CI:
            pytest.fail(f"CI=true and the control plane cannot start: {exc}", pytrace=False)
        pytest.skip(f"no control plane: {exc}")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def core_api(control_plane: ControlPlane) -> Any:
    """The control plane's core API, as its admin, from this process."""
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(control_plane.kubeconfig)))


def _fresh_namespace(core: Any) -> Iterator[str]:
    """A namespace made and deleted (without waiting) through the API from this process: two kubectl processes a
    test cost 0.2 CPU s, 40 s a whole run."""
    from kubernetes.client.rest import ApiException

    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status not in (404, 409):  # a test that deleted it itself (gone, or still terminating)
            raise


@pytest.fixture
def namespace(core_api: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    yield from _fresh_namespace(core_api)


@pytest.fixture
def other_namespace(core_api: Any) -> Iterator[str]:
    """A second fresh namespace, for a test that needs two (one it may not reach, say)."""
    yield from _fresh_namespace(core_api)


_MADE: list[str] = []
_publishers: list[Any] = []  # tests/images/closures.py's Publisher, in xdist's main process
_PROFILES_MADE = "PIPEFILL_TEST_PROFILE_DIR_MADE"  # the profile directory a pytest process made (not the user's)


def pytest_configure(config: pytest.Config) -> None:
    """The fill's profile cache of this pytest process alone (each xdist worker its own), for every process the tests
    start: by default it lives in the machine's temp directory, so a test passed or failed by what earlier runs or
    the other worker's tests left there (a fresh clone's CI starts with none). In the main process, the directory of
    the lock by which xdist's workers share the machine (tests/sharing.py)."""
    if hasattr(config, "workerinput"):
        _own_session()
    given = os.environ.get("PIPEFILL_FILL_PROFILE_DIR")
    if given is None or given == os.environ.get(_PROFILES_MADE):
        _MADE.append(tempfile.mkdtemp(prefix="pipefill-test-profiles-"))
        os.environ["PIPEFILL_FILL_PROFILE_DIR"] = os.environ[_PROFILES_MADE] = _MADE[-1]
    if not hasattr(config, "workerinput"):
        _MADE.append(tempfile.mkdtemp(prefix="pipefill-test-sharing-"))
        os.environ[SHARING_DIR] = _MADE[-1]
        sys.path.insert(0, str(Path(__file__).with_name("images")))
        from closures import start_for_workers  # the images' closures once, not in each worker (62 CPU s each)

        publisher = start_for_workers(config)
        if publisher is not None:
            _publishers.append(publisher)


def _own_session() -> None:
    """An xdist worker leads a session of its own: with Linux's autogroup (on in CI's machines) each worker and the
    processes its tests start are then one scheduling group, as two CI jobs would be, and share the cores fairly with
    the other worker's. In one group with the other worker's tests, a ``pipefill local`` run's fill executors, at
    SCHED_IDLE, got no CPU while those tests computed and did no work (the idle policy ranks within a group)."""
    with contextlib.suppress(OSError):  # already a group's leader (started so by another runner): keep its session
        os.setsid()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = files_in_run_order(items)  # tests/sharing.py: why


def pytest_unconfigure(config: pytest.Config) -> None:
    while _publishers:  # after the workers ended: they read its files
        _publishers.pop().close()
    for path in _MADE:
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Around all of a test, its fixtures and its time limit (pytest-timeout's, which starts inside this): alone or
    beside the other worker's test (tests/sharing.py). Waiting for the other is not the test's own time."""
    with share_the_machine(kind_of(item)):
        yield


_SECONDS: dict[str, float] = {}  # each file's seconds (setup, call, teardown): tests/durations.json, tests/sharing.py
_DURATIONS_OUT = "PIPEFILL_TEST_DURATIONS"  # where a run writes its table of them (a whole run's: the new table)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _SECONDS[path] = _SECONDS.get(path, 0.0) + report.duration
    if "cluster" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _outcomes[report.outcome] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    ran = sum(_outcomes.values())
    if ran:
        terminalreporter.write_line(
            f"control-plane tests: {_outcomes['passed']} passed, {_outcomes['failed']} failed, "
            f"{_outcomes['skipped']} skipped"
        )
    if _IN_CI and _outcomes["skipped"]:
        terminalreporter.write_line("CI=true: control-plane tests must run, not skip", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _IN_CI and _outcomes["skipped"] and exitstatus == 0:
        session.exitstatus = 1
    out = os.environ.get(_DURATIONS_OUT)
    if out and not hasattr(session.config, "workerinput"):  # xdist's main process has every worker's reports
        table = {path: round(seconds, 1) for path, seconds in sorted(_SECONDS.items())}
        Path(out).write_text(json.dumps(table, indent=0) + "\n")
