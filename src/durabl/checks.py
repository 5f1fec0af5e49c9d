"""Checks of arguments to durabl's public API: each rule, and the words that refuse it, once.

They raise plain ``TypeError``/``ValueError``, what Python itself raises for a bad argument.
"""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, *, at_least: int) -> None:
    """Refuse ``value`` unless it is an int (a bool is not) of at least ``at_least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
        raise ValueError(f"{name} must be an int >= {at_least}, got {value!r}")


def check_text(name: str, value: Any) -> None:
    """Refuse ``value`` unless it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string, got {value!r}")


def check_type(name: str, value: Any, expected: type) -> None:
    """Refuse ``value`` unless it is an instance of ``expected``."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be a {expected.__name__}, got {type(value).__name__}")


def check_seconds(name: str, value: Any) -> None:
    """Refuse ``value`` unless it is a positive number of seconds."""
    if not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
