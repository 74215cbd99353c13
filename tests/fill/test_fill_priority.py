"""The fill executor's idle CPU priority holds against its trainer where the kernel groups threads by session
(autogroup): SCHED_IDLE ranks threads within their group only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipefill_fill.device import autogroup_on

CHILD = """\
import json, os
from pipefill_fill.device import idle_priority
ok = idle_priority()
print(json.dumps({"ok": ok, "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
                  "autogroup": open("/proc/self/autogroup").read().strip()}))
"""


def _child(**popen: object) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True, **popen
    )  # type: ignore[call-overload]
    return dict(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.skipif(not autogroup_on(), reason="this kernel does not group threads by session (autogroup off)")
def test_an_executor_leading_its_own_session_puts_that_session_last_and_one_in_a_shared_session_leaves_it() -> None:
    """A session leader's group is its own (nice 19 then); in a session it shares (a shell's, ``pipefill local``'s)
    it must not lower the group of the others: this test's own group stays as it was."""
    mine = Path("/proc/self/autogroup").read_text().strip()
    leader = _child(start_new_session=True)
    assert leader["ok"] and leader["idle"]
    assert str(leader["autogroup"]).endswith(" nice 19") and str(leader["autogroup"]).split()[0] != mine.split()[0]
    member = _child(process_group=0)
    assert member["ok"] and member["idle"]
    assert member["autogroup"] == mine == Path("/proc/self/autogroup").read_text().strip()
