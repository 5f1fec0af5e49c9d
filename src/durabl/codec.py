"""Canonical JSON, step fingerprints and row checksums.

Every value durabl records (inputs, results, ctx values) passes through one canonical JSON form:
sorted keys, no insignificant whitespace, UTF-8, no NaN or infinity. A value is handed to the
workflow only after it has made the round trip, so the first execution and every replay see the
same value (a tuple becomes a list both times, not only on replay).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

from durabl.errors import EncodingError

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_decode = json.JSONDecoder().decode


def encode(value: Any, *, what: str = "value") -> str:
    """Return the canonical JSON text of ``value`` or raise ``EncodingError`` naming ``what``."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodingError(
            f"{what} cannot be recorded: it is not plain JSON data "
            f"(dict with str keys, list, str, int, float, bool, None): {exc}"
        ) from None


def decode(text: str) -> Any:
    """Inverse of ``encode``."""
    return _decode(text)


def round_trip(value: Any, *, what: str = "value") -> tuple[str, Any]:
    """Encode ``value`` and decode it again; returns (text, the value as replay will see it)."""
    text = encode(value, what=what)
    return text, _decode(text)


def fingerprint(canonical_text: str) -> str:
    """A short stable hash of a step's canonical description."""
    return hashlib.blake2b(canonical_text.encode(), digest_size=10).hexdigest()


def checksum(seq: int, kind: str, step: int, fp: str | None, data: str | None, at_s: float) -> int:
    """CRC-32 over every column of an event row that replay depends on."""
    row = f"{seq}\x1f{kind}\x1f{step}\x1f{fp or ''}\x1f{data or ''}\x1f{at_s!r}"
    return zlib.crc32(row.encode())
