"""The launcher forked from a process that has imported its preload already (pipefill/local/forker.py): its children
end as the ``python -m`` children ``Popen`` starts (exit codes, exceptions, KeyboardInterrupt, atexit, non-daemon
threads), never run the code of the process it was forked from, and a process it would not be faithful from (a
second thread, an open descriptor, other start-up variables) starts an interpreter instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipefill import env

# How a child ends, by PROBE_END; at exit it says that atexit ran, and a non-daemon thread's last words come first.
PROBE = """\
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "numpy", "numpy" in sys.modules, flush=True)
end = os.environ.get("PROBE_END", "")
if end == "thread":
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished", flush=True))).start()
elif end == "exit":
    sys.exit(3)
elif end == "message":
    sys.exit("it went wrong")
elif end == "raise":
    raise ValueError("probe failed")
elif end == "interrupt":
    raise KeyboardInterrupt
"""

# A process that has imported the preload (numpy) and forks its launcher at its top, as ``pipefill``'s entry point
# does; MODE adds what makes a fork unfaithful. It prints the launcher's kind and each child's exit, then "driver done".
DRIVER = """\
import json, os, sys, threading
import numpy
from pathlib import Path
from pipefill.local.launcher import Launcher

out, mode, ends = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
if mode == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
if mode == "descriptor":
    kept = os.open(os.devnull, os.O_RDONLY)
environ = dict(os.environ, PYTHONPATH=os.environ["PYTHONPATH"] + ("" if mode != "variables" else os.pathsep))
launcher = Launcher(environ, out / "launcher.log", preload=("numpy",), fork=True)
codes = {}
for end in ends:
    child = launcher.launch([sys.executable, "-m", "probe_end", "--end", end], dict(environ, PROBE_END=end),
                            out / f"{end}.log")
    codes[end] = child.wait(timeout=60) if child is not None else "popen"
launcher.close()
print(json.dumps({"forked": launcher.forked, "codes": codes}))
print("driver done")
"""

ENDS = ("none", "thread", "exit", "message", "raise", "interrupt")


@pytest.fixture
def code(tmp_path: Path) -> dict[str, str]:
    """The environment with the probe and the driver importable."""
    where = tmp_path / "code"
    where.mkdir()
    (where / "probe_end.py").write_text(PROBE)
    (where / "fork_driver.py").write_text(DRIVER)
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), *sys.path]), PYTHONUNBUFFERED="1")
    environ["OMP_NUM_THREADS"] = "1"  # numpy's OpenBLAS starts no thread
    environ.pop(env.PARENT_PID, None)
    return environ


def _drive(tmp_path: Path, environ: dict[str, str], mode: str, *ends: str) -> dict[str, object]:
    out = tmp_path / mode
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "fork_driver", str(out), mode, *ends], env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("driver done") == 1, done.stdout
    result: dict[str, object] = json.loads(done.stdout.splitlines()[0])
    return result


def _unframed(output: str) -> list[str]:
    return [line for line in output.splitlines() if not line.startswith(" ")]


def test_children_of_a_forked_launcher_end_as_popens_and_never_run_the_forking_process_code(
    tmp_path: Path, code: dict[str, str]
) -> None:
    result = _drive(tmp_path, code, "plain", *ENDS)
    assert result["forked"] is True
    for end in ENDS:
        with open(tmp_path / f"popen-{end}.log", "w") as log:
            expected = subprocess.run([sys.executable, "-m", "probe_end", "--end", end], env=dict(code, PROBE_END=end),
                                      stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
        assert result["codes"][end] == expected, end  # type: ignore[index]
        forked = (tmp_path / "plain" / f"{end}.log").read_text()
        popen = (tmp_path / f"popen-{end}.log").read_text()
        assert "driver done" not in forked and '"forked"' not in forked, forked  # none of the driver's code ran
        # the same output but for numpy, preloaded, and a traceback's frames (those of the launcher come first)
        assert _unframed(forked.replace("True", "False")) == _unframed(popen), end
    assert result["codes"] == {  # type: ignore[comparison-overlap]
        "none": 0, "thread": 0, "exit": 3, "message": 1, "raise": 1, "interrupt": -signal.SIGINT,
    }  # fmt: skip
    assert "thread finished\natexit ran" in (tmp_path / "plain" / "thread.log").read_text()
    assert "ValueError: probe failed" in (tmp_path / "plain" / "raise.log").read_text()


@pytest.mark.parametrize("mode", ["thread", "descriptor", "variables"])
def test_a_process_with_a_second_thread_an_open_descriptor_or_other_startup_variables_starts_an_interpreter(
    tmp_path: Path, code: dict[str, str], mode: str
) -> None:
    result = _drive(tmp_path, code, mode, "exit")
    assert result == {"forked": False, "codes": {"exit": 3}}  # its children forked from the interpreter it started
