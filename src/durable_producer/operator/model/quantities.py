"""Kubernetes resource quantities ("20Gi", "500M", "1.5Ti") as exact byte counts."""

from __future__ import annotations

import math
import re
from fractions import Fraction

# A Kubernetes resource quantity such as "20Gi", "500M" or "1024" (the CRD's pattern too).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40

_SUFFIX_MULTIPLIERS: dict[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(QUANTITY_PATTERN)
_BINARY_SUFFIXES = (
    ("Ei", 2**60),
    ("Pi", 2**50),
    ("Ti", TIB),
    ("Gi", GIB),
    ("Mi", MIB),
    ("Ki", KIB),
)


def parse_quantity(quantity: str) -> Fraction:
    """The exact value of a quantity ("100m" -> 1/10). Raises ValueError if malformed."""
    match = _QUANTITY.match(quantity)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    suffix = match.group(2) or ""
    return Fraction(quantity[: len(quantity) - len(suffix)]) * _SUFFIX_MULTIPLIERS[suffix]


def parse_bytes(quantity: str) -> int:
    """Bytes in a quantity, rounded up to a whole byte. Raises ValueError if malformed."""
    return math.ceil(parse_quantity(quantity))


def format_bytes(size: int) -> str:
    """The shortest exact binary quantity for a byte count: 12884901888 -> "12Gi"."""
    for suffix, multiplier in _BINARY_SUFFIXES:
        if size and size % multiplier == 0:
            return f"{size // multiplier}{suffix}"
    return str(size)


def describe_rate(bytes_per_second: int) -> str:
    """A readable rate for messages, e.g. "1.5 MiB/s"."""
    for suffix, multiplier in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if bytes_per_second >= multiplier:
            return f"{bytes_per_second / multiplier:.3g} {suffix}/s"
    return f"{bytes_per_second} B/s"
