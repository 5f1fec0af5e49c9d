"""Receipts sealed with HMAC-SHA256, and their verification.

A bench run writes ``receipts/000001.json``, ``000002.json``, ... and ``receipts/MANIFEST.json``.
Each receipt file is the canonical JSON of ``{"body": ..., "seal": ...}``; the body names its bench
run, its own index and the MAC of the receipt before it, so a receipt moved to another name, a
receipt dropped from the middle and one copied from another run all break the chain. The
manifest, sealed the same way, holds the count and the last MAC, so a dropped last receipt and an
added one are caught too. Every file must be byte for byte its canonical form: any changed byte
fails, whitespace included.

The key comes from ``DURABL_BENCH_KEY`` or from a key file (default
``$XDG_CONFIG_HOME/durabl/bench.key``), created with mode 0600 on first use and never inside the
output folder. Receipts carry the key's id (a MAC of a fixed label), never the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_VARIABLE = "DURABL_BENCH_KEY"
ALGORITHM = "HMAC-SHA256"
MANIFEST = "MANIFEST.json"
RECEIPT_SCHEMA = "durabl-bench-receipt/1"
MANIFEST_SCHEMA = "durabl-bench-manifest/1"


class BenchInputError(Exception):
    """A user error: one line, exit code 2, nothing written."""


def default_key_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "durabl" / "bench.key"


@dataclass(frozen=True)
class Key:
    secret: bytes
    source: str

    @property
    def id(self) -> str:
        return hmac.new(self.secret, b"durabl bench key id", hashlib.sha256).hexdigest()[:16]


def load_key(key_file: Path | None, *, create: bool, out: Path | None = None) -> Key:
    """The sealing key: the environment variable if set, else the key file, created (0600) only
    when ``create``. A key file inside ``out`` is refused: it must never lie beside receipts."""
    value = os.environ.get(KEY_VARIABLE)
    if value is not None:
        if len(value) < 16:
            raise BenchInputError(f"{KEY_VARIABLE} is too short: use at least 16 characters")
        return Key(value.encode(), f"${KEY_VARIABLE}")
    path = (key_file or default_key_file()).expanduser()
    if out is not None and path.resolve().is_relative_to(out.resolve()):
        raise BenchInputError(
            f"key file {path} is inside the output folder {out}: keep the key away from the "
            f"receipts it seals (--key-file elsewhere, or set {KEY_VARIABLE})"
        )
    if not path.exists():
        if not create:
            raise BenchInputError(
                f"no key to verify with: {KEY_VARIABLE} is not set and {path} does not exist"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise BenchInputError(
            f"key file {path} is readable by others (mode {mode:04o}): chmod 600 {path}"
        )
    secret = path.read_text().strip().encode()
    if not secret:
        raise BenchInputError(f"key file {path} is empty")
    return Key(secret, str(path))


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def mac_of(key: Key, body: dict[str, Any]) -> str:
    return hmac.new(key.secret, canonical(body), hashlib.sha256).hexdigest()


def sealed(key: Key, body: dict[str, Any]) -> bytes:
    """The bytes of a sealed file for ``body``."""
    seal = {"alg": ALGORITHM, "key_id": key.id, "mac": mac_of(key, body)}
    return canonical({"body": body, "seal": seal}) + b"\n"


def receipt_name(index: int) -> str:
    return f"{index:06d}.json"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ReceiptWriter:
    """Appends sealed receipts to ``folder`` and keeps its manifest current."""

    def __init__(self, folder: Path, key: Key, bench_run: str, options: dict[str, Any]) -> None:
        self.folder = folder
        self.key = key
        self.bench_run = bench_run
        self.options = options
        self.count = 0
        self.last_mac = ""
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, body: dict[str, Any]) -> dict[str, Any]:
        full = {
            "schema": RECEIPT_SCHEMA,
            "bench_run": self.bench_run,
            "index": self.count + 1,
            "prev": self.last_mac,
            **body,
        }
        data = sealed(self.key, full)
        path = self.folder / receipt_name(self.count + 1)
        if path.exists():
            raise BenchInputError(f"{path} already exists: refusing to overwrite a receipt")
        _write_atomic(path, data)
        self.count += 1
        self.last_mac = mac_of(self.key, full)
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "bench_run": self.bench_run,
            "count": self.count,
            "last": self.last_mac,
            "options": self.options,
        }
        _write_atomic(self.folder / MANIFEST, sealed(self.key, manifest))
        return full


def tamper_rejected(key: Key, body: dict[str, Any]) -> bool:
    """Seal ``body``, change one byte of the sealed text, and check the seal catches it."""
    data = bytearray(sealed(key, body))
    i = data.index(b'"body"') + 10
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    return _open(bytes(data), key, "probe")[1] is not None


def _open(data: bytes, key: Key, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The body of one sealed file, or the one-line reason it is not to be trusted."""
    try:
        parsed = json.loads(data)
        body, seal = parsed["body"], parsed["seal"]
    except (ValueError, KeyError, TypeError):
        return None, f"{name}: not a sealed receipt (unreadable JSON): changed after sealing"
    if not isinstance(body, dict) or not isinstance(seal, dict):
        return None, f"{name}: not a sealed receipt: changed after sealing"
    if seal.get("key_id") != key.id:
        return None, (
            f"{name}: sealed with another key (key id {seal.get('key_id')}, this key is {key.id})"
        )
    if seal.get("alg") != ALGORITHM or not hmac.compare_digest(
        str(seal.get("mac", "")), mac_of(key, body)
    ):
        return None, f"{name}: seal does not match its contents: changed after sealing"
    if data != canonical(parsed) + b"\n":
        return None, f"{name}: bytes differ from the sealed form: changed after sealing"
    return body, None


@dataclass
class Verified:
    receipts: list[dict[str, Any]]
    manifest: dict[str, Any] | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and self.manifest is not None


def receipt_files(folder: Path) -> Iterator[Path]:
    yield from sorted(p for p in folder.glob("*.json") if p.name != MANIFEST)


def verify(out: Path, key: Key) -> Verified:
    """Check every receipt under ``out/receipts`` and the manifest; collect one line per
    problem. Receipts are returned only when there is none."""
    folder = out / "receipts"
    problems: list[str] = []
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return Verified([], None, [f"{manifest_path}: missing: the receipt set is incomplete"])
    manifest, problem = _open(manifest_path.read_bytes(), key, MANIFEST)
    if manifest is None:
        return Verified([], None, [problem or MANIFEST])
    count = int(manifest.get("count", -1))
    run = manifest.get("bench_run")
    names = {p.name for p in receipt_files(folder)}
    expected = {receipt_name(i) for i in range(1, count + 1)}
    problems += [
        f"{n}: missing (the manifest lists {count} receipts)" for n in sorted(expected - names)
    ]
    problems += [f"{n}: not in the manifest: added after sealing" for n in sorted(names - expected)]
    receipts: list[dict[str, Any]] = []
    prev: str | None = ""  # the seal the next receipt must name; None after a gap in the chain
    for i in range(1, count + 1):
        name = receipt_name(i)
        if name not in names:
            prev = None
            continue
        body, problem = _open((folder / name).read_bytes(), key, name)
        if body is None:
            problems.append(problem or name)
            prev = None
            continue
        if body.get("bench_run") != run:
            problems.append(f"{name}: belongs to bench run {body.get('bench_run')}, not {run}")
        elif body.get("index") != i:
            problems.append(f"{name}: holds receipt {body.get('index')}: moved or reordered")
        elif prev is not None and body.get("prev") != prev:
            problems.append(f"{name}: does not follow receipt {i - 1}: reordered or replaced")
        receipts.append(body)
        prev = mac_of(key, body)
    if not problems and prev != manifest.get("last"):
        problems.append(f"{MANIFEST}: the last receipt is not the one sealed last")
    return Verified(receipts if not problems else [], manifest, problems)
