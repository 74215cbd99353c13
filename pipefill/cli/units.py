"""Durations and sizes as people write them on a command line (``250ms``, ``6GiB``), with errors that name the flag.

Sizes follow the Kubernetes quantity grammar of the spec (:func:`pipefill.spec.parse_bytes`), plus a trailing ``B``.
"""

from __future__ import annotations

import re

from pipefill.spec import parse_bytes

__all__ = ["parse_duration_s", "parse_size_bytes"]

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|µs|ms|s|m|h)\s*$")
_DURATION_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_s(value: str, *, field: str = "duration") -> float:
    """Seconds from ``250ms``, ``0.25s``, ``1.5ms`` or ``800us``; a unit is required so a bare number is never guessed."""
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(
            f"{field}: invalid duration {value!r}: expected a number with a unit (us, ms, s), such as 250ms or 0.25s"
        )
    return float(match.group(1)) * _DURATION_UNIT_S[match.group(2)]


def parse_size_bytes(value: str, *, field: str = "size") -> int:
    """Bytes from ``6GiB``, ``512MiB``, ``6Gi``, ``1.5G`` or ``4096`` (a trailing ``B`` is allowed and ignored)."""
    text = value.strip()
    if text.endswith("B") and not text.endswith("iB") and text[:-1].rstrip().isdigit():
        text = text[:-1]  # "4096B"
    elif text.endswith("iB") or (len(text) > 1 and text.endswith("B") and text[-2] in "kKMGTPE"):
        text = text[:-1]  # "6GiB" -> "6Gi", "6GB" -> "6G"
    try:
        size = parse_bytes(text, field=field)
    except ValueError:
        raise ValueError(
            f"{field}: invalid size {value!r}: expected bytes with an optional unit, such as 6GiB, 512MiB, 6Gi or 4096"
        ) from None
    if size < 0:
        raise ValueError(f"{field}: invalid size {value!r}: must not be negative")
    return size
