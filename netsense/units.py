"""Rates, durations and percentages written the way tc and Kubernetes users write them.

Rates are bits per second: ``200Mbit``, ``1Gbit``, ``500kbit``, ``1.5Gbit``.
tc reads ``Mbps`` as *megabytes* per second, a classic source of 8x errors, so
byte-based spellings are refused with a message that says what to write instead.
Durations: ``30s``, ``2m``, ``500ms``, ``1h`` or a bare number of seconds.
"""

from __future__ import annotations

import re

from netsense.errors import BadInput

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RATE_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]+)\s*$")
_DURATION_RE = re.compile(rf"^\s*{_NUMBER}\s*(ms|s|m|h)?\s*$")
_PERCENT_RE = re.compile(rf"^\s*{_NUMBER}\s*%\s*$")

RATE_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*([kKmMgGtT]?[bB][iI][tT])$"
DURATION_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|h)?$"
DURATION_UNIT_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|h)$"  # in a job: the unit is required
PERCENT_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*%$"


class UnitError(BadInput, ValueError):
    """A value that is not a rate/duration/percentage; the message says why."""


def parse_rate(value: object) -> float:
    """``"200Mbit"`` -> 200e6 (bits per second). Must be > 0."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(f"a rate is a string like '200Mbit' or '1Gbit' (got {value!r})")
    m = _RATE_RE.match(value)
    if not m and value.strip().startswith("-") and _RATE_RE.match(value.strip()[1:]):
        raise UnitError(f"{value!r}: a rate must be positive")
    if not m:
        raise UnitError(f"{value!r} is not a rate; write e.g. '200Mbit', '1Gbit', '500kbit'")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _RATE_UNITS:
        if unit.endswith(("bps", "byte", "bytes")):
            raise UnitError(
                f"{value!r}: byte-based rates are ambiguous (tc reads 'Mbps' as megaBYTES/s); "
                "write bits per second, e.g. '200Mbit'"
            )
        raise UnitError(f"{value!r}: unknown rate unit {m.group(2)!r} (use bit, kbit, Mbit, Gbit)")
    bps = number * _RATE_UNITS[unit]
    if bps <= 0:
        raise UnitError(f"{value!r}: a rate must be greater than zero")
    return bps


def format_rate(bps: float) -> str:
    """200e6 -> '200Mbit' (exact when possible, else kbit granularity, as tc accepts)."""
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale and abs(bps / scale - round(bps / scale)) < 1e-9:
            return f"{round(bps / scale)}{unit}"
    return f"{max(1, round(bps / 1e3))}kbit"


def is_bare_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def bare_number_message(kind: str, value: object) -> str:
    """Why a bare number is refused where a unit belongs, and what to write."""
    if kind == "duration":
        return (f"{value!r} has no unit: write '{value}ms' or '{value}s' (a bare number could mean either: tc "
                "reads one as milliseconds, most configs as seconds)")
    if kind == "percent":
        return (f"{value!r} has no unit: write '{value}%' for {value} percent (a bare number could be a "
                "fraction or a percentage)")
    return f"a rate is a string like '200Mbit' or '1Gbit' (got {value!r})"


def parse_duration(value: object) -> float:
    """``"30s"`` -> 30.0, ``"2m"`` -> 120.0, ``"500ms"`` -> 0.5, ``45`` -> 45.0 (seconds)."""
    if isinstance(value, bool):
        raise UnitError(f"a duration is like '30s' or '2m' (got {value!r})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    else:
        raise UnitError(f"{value!r} is not a duration; write e.g. '30s', '2m', '500ms'")
    if seconds < 0:
        raise UnitError(f"{value!r}: a duration cannot be negative")
    return seconds


def parse_fraction_or_percent(value: object) -> float:
    """``"0.1%"`` -> 0.001; a bare number is a fraction in [0, 1]."""
    if isinstance(value, bool):
        raise UnitError(f"expected a percentage like '0.1%' (got {value!r})")
    if isinstance(value, (int, float)):
        frac = float(value)
    elif isinstance(value, str) and (m := _PERCENT_RE.match(value)):
        frac = float(m.group(1)) / 100.0
    else:
        raise UnitError(f"{value!r} is not a percentage; write e.g. '0.1%'")
    if not 0.0 <= frac <= 1.0:
        raise UnitError(f"{value!r}: must be between 0% and 100% (got {frac * 100:g}%)")
    return frac
