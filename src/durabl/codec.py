"""Canonical JSON, step fingerprints and row checksums.

Every value durabl records (inputs, results, ctx values) passes through one canonical JSON form:
sorted keys, no insignificant whitespace, UTF-8, no NaN or infinity. A value is handed to the
workflow only after it has made the round trip, so the first execution and every replay see the
same value (a tuple becomes a list both times, not only on replay).
"""

from __future__ import annotations

import json
import json.scanner
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import Any

try:  # the module hashlib takes blake2b from; hashlib itself also loads OpenSSL (~2 ms)
    from _blake2 import blake2b
except ImportError:  # an interpreter without it
    from hashlib import blake2b

from durabl.errors import EncodingError

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_decode = json.JSONDecoder().decode
# The C scanner JSONDecoder.decode wraps, called directly: decode() adds two regex matches for
# whitespace that canonical text never has, and durabl decodes a result on every step served.
_MAKE_SCANNER = getattr(json.scanner, "c_make_scanner", None)  # None without the C accelerator
_scan = None if _MAKE_SCANNER is None else _MAKE_SCANNER(json.JSONDecoder())

# The same encoder, made once. JSONEncoder.encode builds a new C encoder on every call, which
# is most of what encoding a small record costs, and durabl encodes several on every step. This
# one keeps no circular-reference markers, so it holds no state and threads may share it; a
# value it cannot encode is encoded again by _ENCODER, whose error is the one reported.
_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # None without the C accelerator
_C_ENCODER = (
    None
    if _MAKE_ENCODER is None
    else _MAKE_ENCODER(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


_encode_str = json.encoder.encode_basestring


Described = str | Callable[[], str]
"""What a value is, for the error that refuses it: a text, or a function that makes one (a
message built on every step for the rare value that fails costs more than the encoding)."""


def encode(value: Any, *, what: Described = "value") -> str:
    """Return the canonical JSON text of ``value`` or raise ``EncodingError`` naming ``what``."""
    try:
        try:
            if _C_ENCODER is None:
                text = _ENCODER.encode(value)
            else:  # the shared C encoder (see above), called here: this runs at every step
                try:
                    text = "".join(_C_ENCODER(value, 0))
                except (TypeError, ValueError, RecursionError):
                    text = _ENCODER.encode(value)
        except TypeError:
            _check_keys(value)  # a clearer message when mixed key types broke the sort
            raise
        if type(value) is dict:
            # Most values durabl encodes, a tool's arguments and result on every step, are
            # flat dicts with str keys: told apart here, without the walk or even its call.
            for key, item in value.items():
                if type(key) is not str or (
                    type(item) not in _SCALARS and isinstance(item, _CONTAINERS)
                ):
                    _check_keys(value)
                    break
        elif isinstance(value, _CONTAINERS):
            _check_keys(value)
        if not text.isascii():
            text.encode()  # a lone surrogate has no UTF-8 form and could not be stored
        return text
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodingError(
            what=what if isinstance(what, str) else what(), reason=str(exc)
        ) from None


def _check_keys(value: Any) -> None:
    """JSON would silently turn a key like 1 or None into "1" or "null"; refuse instead.
    (``encode`` looks at a flat dict itself, and calls this for anything else.)"""
    if not isinstance(value, _CONTAINERS):
        return
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key in item:
                if type(key) is not str:
                    raise TypeError(f"dict key {key!r} is a {type(key).__name__}, not a str")
            stack.extend(v for v in item.values() if isinstance(v, _CONTAINERS))
        elif isinstance(item, _CONTAINERS):
            stack.extend(v for v in item if isinstance(v, _CONTAINERS))


_CONTAINERS = (dict, list, tuple)
_SCALARS = frozenset((str, int, float, bool, type(None)))
"""The exact types that are never containers: a set lookup of the type is cheaper than the
``isinstance`` over ``_CONTAINERS`` it saves, which walks the type's ancestors three times."""


def decode(text: str) -> Any:
    """Inverse of ``encode``."""
    if _scan is not None:
        try:
            value, end = _scan(text, 0)
        except StopIteration:  # not JSON at its first character: let decode() say why
            return _decode(text)
        if end == len(text):
            return value
    return _decode(text)  # whitespace or more after the value: decode() takes it or says why


def decode_or_none(text: str | None) -> Any:
    """``decode``, for a column that may be NULL: None stays None."""
    return None if text is None else decode(text)


def pair(first: str, second: str) -> str:
    """The JSON array of two JSON texts, ``[first,second]``: one column holding both."""
    return f"[{first},{second}]"


def unpair(text: str) -> tuple[str, str]:
    """The two texts ``pair`` put together. The first is found by scanning its value, so a
    large second text (a tool's result) is sliced, never parsed."""
    scan = _scan if _scan is not None else json.JSONDecoder().raw_decode
    end = scan(text, 1)[1]
    return text[1:end], text[end + 1 : -1]


def round_trip(value: Any, *, what: Described = "value") -> tuple[str, Any]:
    """Encode ``value`` and decode it again; returns (text, the value as replay will see it)."""
    text = encode(value, what=what)
    return text, decode(text)


def encode_str(text: str, *, what: str = "value") -> str:
    """``encode`` of one string, without the walk a container needs: for the records durabl
    builds around a string it holds (a key)."""
    out = _encode_str(text)
    if not out.isascii():
        try:
            out.encode()  # a lone surrogate has no UTF-8 form and could not be stored
        except UnicodeEncodeError as exc:
            raise EncodingError(what=what, reason=str(exc)) from None
    return out


def fingerprint(canonical_text: str) -> str:
    """A short stable hash of a step's canonical description."""
    return blake2b(canonical_text.encode(), digest_size=10).hexdigest()


def storable(text: str) -> str:
    """``text`` as every backend can store it in a text column: a NUL (which PostgreSQL's text
    refuses) and a lone surrogate (which is not UTF-8 at all) are written out as escapes. For
    the free text of error messages, which come from any exception's ``str``; JSON columns
    escape these already."""
    if "\x00" not in text and text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


CHECKSUM_FORMAT_1 = 1 << 32
"""An event's stored crc names the formula that made it in its bits above the low 32. Format
0 is the CRC-32 of the row as text, its time written by ``repr``; format 1, of the same text
up to the time and then the time's eight bytes as an IEEE 754 double, little-endian, for
about half the cost to write and to check (``repr`` of a float was a third of the check). A
row keeps the format it was written in: a file from before format 1 is read as it is."""

_time_bytes = struct.Struct("<d").pack


def checksum(seq: int, kind: str, step: int, fp: str | None, data: str | None, at_s: float) -> int:
    """The crc stored with an event row: CRC-32 over every column that replay depends on, in
    format 1 (``CHECKSUM_FORMAT_1``)."""
    text = f"{seq}\x1f{kind}\x1f{step}\x1f{fp or ''}\x1f{data or ''}\x1f"
    return CHECKSUM_FORMAT_1 | zlib.crc32(text.encode() + _time_bytes(at_s))


def checksum_format_0(
    seq: int, kind: str, step: int, fp: str | None, data: str | None, at_s: float
) -> int:
    """The crc durabl stored with an event row before format 1, which its rows still carry."""
    row = f"{seq}\x1f{kind}\x1f{step}\x1f{fp or ''}\x1f{data or ''}\x1f{float(at_s)!r}"
    return zlib.crc32(row.encode())


def holds(
    seq: int, kind: str, step: int, fp: str | None, data: str | None, at_s: float, crc: int
) -> bool:
    """Whether ``crc`` is the checksum of the row's columns, in the format it names."""
    return first_corrupt(((seq, kind, step, fp, data, at_s, crc),)) is None


def first_corrupt(rows: Iterable[tuple[Any, ...]]) -> int | None:
    """The seq of the first of ``rows`` whose crc is not the checksum of its columns, in
    either format, or None when every one holds. A row is (seq, kind, step, fp, data, at_s,
    crc), as the stores read the log."""
    crc32, time_bytes = zlib.crc32, _time_bytes
    for seq, kind, step, fp, data, at_s, crc in rows:
        # ``checksum`` and ``checksum_format_0``, inline: a replay verifies every event it
        # reads, and a call per row was a twentieth of what serving a step costs.
        text = f"{seq}\x1f{kind}\x1f{step}\x1f{fp or ''}\x1f{data or ''}\x1f"
        if crc >= CHECKSUM_FORMAT_1:
            if CHECKSUM_FORMAT_1 | crc32(text.encode() + time_bytes(at_s)) != crc:
                return seq
        elif crc32(f"{text}{float(at_s)!r}".encode()) != crc:
            return seq
    return None


def snapshot_checksum(watermark: int, snapshot: str) -> int:
    """CRC-32 over a compaction snapshot and the seq it folds up to."""
    return zlib.crc32(f"{watermark}\x1f{snapshot}".encode())
