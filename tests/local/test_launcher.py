"""The preloaded launcher of ``pipefill local``'s children: a forked child is the ``python -m`` child ``Popen`` starts,
exit statuses and signals are ``Popen``'s, a child it cannot start faithfully is left to ``Popen``, and a launcher that
dies takes its children with it and is never used again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import alive
from waiting import wait_for

from pipefill import env
from pipefill.local.launcher import Forked, Launcher, signal_group
from pipefill.local.procs import LocalProcess

# What a child sees, as one JSON line; then it exits with PROBE_EXIT, or sleeps (tied to its parent) with PROBE_SLEEP.
PROBE = """\
import gc, json, os, sys, time
from pipefill.parent import stop_with_parent

stop_with_parent()
record = {
    "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "ppid": os.getppid(),
    "parent": os.environ.get("PIPEFILL_PARENT_PID"), "sid": os.getsid(0), "group_leader": os.getpgid(0) == os.getpid(),
    "numpy_preloaded": "numpy" in sys.modules, "frozen": gc.get_freeze_count(),
    "cmdline": open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip(),
}
if "numpy" in sys.modules:
    record["draw"] = float(sys.modules["numpy"].random.rand())
print(json.dumps(record), flush=True)
if os.environ.get("PROBE_ECHO"):
    print("echo:", sys.stdin.readline().strip(), file=sys.stderr, flush=True)
if os.environ.get("PROBE_SLEEP"):
    time.sleep(float(os.environ["PROBE_SLEEP"]))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a launcher and its children: the probe module importable, tied to this process."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe_child.py").write_text(PROBE)
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    environ[env.PARENT_PID] = str(os.getpid())
    return environ


@pytest.fixture
def launcher(tmp_path: Path, probe_env: dict[str, str]):  # type: ignore[no-untyped-def]
    started = Launcher(probe_env, tmp_path / "launcher.log", preload=("numpy",))
    yield started
    started.close()


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe_child", *args]


def _record(log: Path) -> dict[str, object]:
    return json.loads(log.read_text().splitlines()[-1])


def test_a_forked_child_is_the_child_popen_starts_with_numpy_already_imported(
    tmp_path: Path, probe_env: dict[str, str], launcher: Launcher
) -> None:
    environ = {**probe_env, "PROBE": "forked", "PROBE_EXIT": "3"}
    child = launcher.launch(_argv("--flag", "two words"), environ, tmp_path / "forked.log")
    assert isinstance(child, Forked)
    assert child.wait(timeout=30) == 3
    with open(tmp_path / "popen.log", "wb") as log:
        popen = subprocess.Popen(_argv("--flag", "two words"), env={**environ, "PROBE": "popen"}, stdout=log,
                                 process_group=0)  # fmt: skip
        assert popen.wait(timeout=30) == 3
    forked, started = _record(tmp_path / "forked.log"), _record(tmp_path / "popen.log")
    assert (forked["probe"], started["probe"]) == ("forked", "popen")
    for key in ("name", "argv", "cwd", "sid", "group_leader"):
        assert forked[key] == started[key], key
    # a process group of its own, in this process's session: one autogroup, where SCHED_IDLE ranks below the trainer
    assert forked["group_leader"] and forked["sid"] == os.getsid(0)
    assert forked["name"] == "__main__" and str(forked["argv"][0]).endswith("probe_child.py")  # type: ignore[index]
    assert forked["argv"][1:] == ["--flag", "two words"]  # type: ignore[index]
    # its parent is the launcher, and it is tied to the launcher (which is tied to this process)
    assert forked["parent"] == str(forked["ppid"]) != str(os.getpid())
    assert forked["numpy_preloaded"] and not started["numpy_preloaded"]
    # the preload's objects are out of its cycle collector: its full collections skip them (pipefill_fill.collect)
    assert int(forked["frozen"]) > 0 and started["frozen"] == 0  # type: ignore[call-overload]
    assert "probe_child --flag 'two words'" in str(forked["cmdline"])  # what ps and pgrep -f show


def test_a_child_given_pipes_and_a_directory_reads_and_writes_them_and_its_pipes_end_with_it(
    tmp_path: Path, probe_env: dict[str, str], launcher: Launcher
) -> None:
    """The streams passed are the child's 0, 1 and 2; the launcher keeps no copy, so each pipe ends when the child
    does (a reader waiting for EOF would otherwise wait for the launcher); the log is not touched."""
    (tmp_path / "elsewhere").mkdir()
    child_in, ours_in = os.pipe()
    ours_out, child_out = os.pipe()
    ours_err, child_err = os.pipe()
    environ = {**probe_env, "PROBE_ECHO": "1"}
    child = launcher.launch(_argv(), environ, tmp_path / "unused.log", cwd=tmp_path / "elsewhere",
                            stdio=(child_in, child_out, child_err))  # fmt: skip
    for fd in (child_in, child_out, child_err):
        os.close(fd)
    assert isinstance(child, Forked)
    with open(ours_in, "w") as stdin, open(ours_out) as stdout, open(ours_err) as stderr:
        stdin.write("hello\n")
        stdin.close()
        record = json.loads(stdout.readline())
        assert (stdout.read(), stderr.read()) == ("", "echo: hello\n")  # both at EOF: the child exited
    assert child.wait(timeout=30) == 0
    assert record["cwd"] == str(tmp_path / "elsewhere")
    assert not (tmp_path / "unused.log").exists()


def test_exit_statuses_and_signals_are_popens_and_each_child_draws_its_own_random_numbers(
    tmp_path: Path, probe_env: dict[str, str], launcher: Launcher
) -> None:
    sleeping = {**probe_env, "PROBE_SLEEP": "60"}
    children = [launcher.launch(_argv(), sleeping, tmp_path / f"{i}.log") for i in range(2)]
    assert all(isinstance(c, Forked) for c in children)
    for child, log in zip(children, ("0.log", "1.log"), strict=True):
        wait_for(lambda log=log: (tmp_path / log).exists() and (tmp_path / log).read_text(), f"{log} written")
        assert child is not None and child.poll() is None
    assert _record(tmp_path / "0.log")["draw"] != _record(tmp_path / "1.log")["draw"]  # numpy reseeded in each
    assert children[0] is not None and children[1] is not None
    os.killpg(children[0].pid, signal.SIGKILL)
    os.killpg(children[1].pid, signal.SIGTERM)
    assert (children[0].wait(timeout=30), children[1].wait(timeout=30)) == (-signal.SIGKILL, -signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        running = launcher.launch(_argv(), sleeping, tmp_path / "2.log")
        assert running is not None
        try:
            running.wait(timeout=0.2)
        finally:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait(timeout=30)


def test_a_child_with_other_start_up_variables_or_not_python_m_starts_with_popen(
    tmp_path: Path, probe_env: dict[str, str], launcher: Launcher
) -> None:
    assert launcher.module_of(_argv(), probe_env) == "probe_child"
    assert launcher.module_of(_argv(), {**probe_env, "TORCH_LOGS": "dynamo"}) is None  # torch reads it at import
    assert launcher.module_of(_argv(), {**probe_env, "PYTHONPATH": "/elsewhere"}) is None
    assert launcher.module_of(_argv(), {**probe_env, "PIPEFILL_HOOK": "1"}) is None  # the hook's sitecustomize reads it
    assert launcher.module_of([sys.executable, "-c", "pass"], probe_env) is None
    assert launcher.module_of(["/usr/bin/python3", "-m", "probe_child"], probe_env) is None
    proc = LocalProcess(0, "trainer", _argv(), {**probe_env, "OMP_NUM_THREADS": "7"}, tmp_path / "p", 0, launcher)
    proc.start()
    try:
        assert isinstance(proc.child, subprocess.Popen)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.close()
    assert _record(tmp_path / "p" / "output.log")["numpy_preloaded"] is False
    forked = LocalProcess(0, "trainer", _argv(), probe_env, tmp_path / "f", 0, launcher)
    forked.start()
    assert isinstance(forked.child, Forked) and forked.wait(timeout=30) == 0
    assert _record(tmp_path / "f" / "output.log")["numpy_preloaded"] is True
    for started in ("p", "f"):  # either way its own group in this session (the fill's SCHED_IDLE: launcher.py)
        record = _record(tmp_path / started / "output.log")
        assert (record["group_leader"], record["sid"]) == (True, os.getsid(0)), started


def test_a_killed_launcher_stops_its_children_and_is_not_used_again(
    tmp_path: Path, probe_env: dict[str, str], launcher: Launcher, caplog: pytest.LogCaptureFixture
) -> None:
    child = launcher.launch(_argv(), {**probe_env, "PROBE_SLEEP": "60"}, tmp_path / "c.log")
    assert child is not None
    wait_for(lambda: (tmp_path / "c.log").exists() and (tmp_path / "c.log").read_text(), "the child started")
    os.kill(int(str(_record(tmp_path / "c.log")["ppid"])), signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGTERM  # it got SIGTERM from the kernel; how it ended is not known
    assert launcher.launch(_argv(), probe_env, tmp_path / "d.log") is None
    assert launcher.launch(_argv(), probe_env, tmp_path / "e.log") is None
    assert "exited (-9)" in launcher.down
    warned = [r.getMessage() for r in caplog.records if "launcher is down" in r.getMessage()]
    assert warned == ["the preloaded launcher is down (it exited (-9)): each process imports torch itself"]  # once


def test_a_preload_that_fails_leaves_every_child_to_popen(tmp_path: Path, probe_env: dict[str, str]) -> None:
    broken = tmp_path / "code" / "broken_preload.py"
    broken.write_text("raise RuntimeError('no device here')\n")
    launcher = Launcher(probe_env, tmp_path / "launcher.log", preload=("broken_preload",))
    try:
        assert not launcher.ready(timeout=30)
        assert launcher.launch(_argv(), probe_env, tmp_path / "x.log") is None
        assert "RuntimeError: no device here" in launcher.down
    finally:
        launcher.close()


def test_a_signal_reaches_a_child_that_leads_no_group_yet_and_a_whole_group_otherwise() -> None:
    """A forked child's pid reaches the runner before the child calls ``setpgid()``: a signal to its group then finds
    none, and went nowhere; it goes to the child alone. A child that leads its group gets it with its own children."""
    before_setpgid = subprocess.Popen(["sleep", "30"])  # in this process's group, as a fork is until its setpgid()
    assert signal_group(before_setpgid.pid, signal.SIGTERM)
    assert before_setpgid.wait(10) == -signal.SIGTERM
    assert not signal_group(before_setpgid.pid, signal.SIGTERM)  # gone and reaped: nothing to signal, no error
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, process_group=0)
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    signal_group(leader.pid, signal.SIGTERM)
    assert leader.wait(10) == -signal.SIGTERM
    leader.stdout.close()
    wait_for(lambda: not alive(grandchild), "the leader's own child ended with its group", 10)
