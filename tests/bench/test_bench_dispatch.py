"""``pipefill bench`` runs a benchmark of another package (the operator's) as a child process: the core never
imports ``pipefill_operator`` (#22: no import by string around the layers check)."""

from __future__ import annotations

import subprocess
import sys

from pipefill.bench import BENCHMARKS

_PROBE = """
import argparse, sys
from pipefill.cli.bench import run
code = run(argparse.Namespace(name=sys.argv[1], bench_args=sys.argv[2:]))
print("IMPORTED" if any(m.split(".")[0] == "pipefill_operator" for m in sys.modules) else "NOT IMPORTED", code)
"""


def _probe(*args: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_the_operator_benchmark_runs_in_a_child_process_and_the_core_never_imports_the_operator() -> None:
    assert not BENCHMARKS["operator"].startswith("pipefill.")
    out, _ = _probe("operator", "--help")
    assert "pipefill bench operator" in out  # the child's argparse answered
    assert out.splitlines()[-1] == "NOT IMPORTED 0", out


def test_the_childs_exit_code_is_the_commands() -> None:
    out, err = _probe("operator", "--jobs", "0")
    assert out.splitlines()[-1] == "NOT IMPORTED 2", out
    assert "--jobs >= 1" in err
