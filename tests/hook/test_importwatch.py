"""pipefill.importwatch: a function runs right after a module's first import (the hook's and the bench clock's way
in), once however often it was asked for, and at once for a module already imported."""

from __future__ import annotations

import subprocess
import sys

from hook_procs import REPO

_PROBE = """
import sys
from pipefill.importwatch import when_imported
seen = []
def note(module):
    seen.append((module.__name__, hasattr(module, "rgb_to_hsv")))
when_imported("colorsys", note)
when_imported("colorsys", note)  # asked twice before the import: one call
assert "colorsys" not in sys.modules and seen == []
import colorsys
import colorsys  # a second import runs nothing
when_imported("sys", note)  # already imported: at once
print(seen)
"""


def test_a_function_runs_once_right_after_the_first_import_or_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('colorsys', True), ('sys', False)]"
