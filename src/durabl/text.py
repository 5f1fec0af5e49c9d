"""Wording shared by everything that prints for people (the command line, the doctor).

A leaf: it imports nothing from durabl, so any module may use it.
"""

from __future__ import annotations


def counted(n: int, thing: str) -> str:
    """``n`` and ``thing``, plural unless there is exactly one: "1 run", "0 runs", "3 runs"."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"
