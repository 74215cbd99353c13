"""Kubernetes resource quantities ("6Gi", "500m", "1e3") for the few places the core needs their value."""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["QUANTITY_PATTERN", "parse_bytes", "parse_quantity"]

# The API server's own quantity grammar (k8s.io/apimachinery resource.Quantity).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_RE = re.compile(QUANTITY_PATTERN)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: int | float | str, *, field: str = "quantity") -> Decimal:
    """The numeric value of a quantity; ``field`` names it in the error."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: Invalid value: {value!r}: must be a quantity such as 6Gi, 512Mi or 2")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = value.strip()
    if not _RE.match(text):
        raise ValueError(f"{field}: Invalid value: {value!r}: must be a quantity such as 6Gi, 512Mi or 2")
    number = text.rstrip("KMGTPEinumk")
    suffix = text[len(number) :]
    if suffix and suffix[0] in "eE":
        return Decimal(text)
    return Decimal(number) * _SUFFIX[suffix]


def parse_bytes(value: int | float | str, *, field: str = "quantity") -> int:
    """A quantity of bytes as an integer (rounded up)."""
    amount = parse_quantity(value, field=field)
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))
