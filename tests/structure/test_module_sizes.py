"""Modules stay small enough to read in one sitting: none over 400 lines (the style's limit; most are 150–250)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["pipefill", "trainer-image/pipefill_trainer", "fill-image/pipefill_fill", "operator/pipefill_operator"]
MAX_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 50  # the packages were found
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"
