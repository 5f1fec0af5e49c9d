"""What the global options point at, opened: the modules named by ``--import`` (and the
runtime options they define), the database as a read-only store, and a runtime on it.

A read-only store never creates, migrates or writes the file; commands that only look use it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from durabl.cli.options import UsageError
from durabl.runtime import Runtime
from durabl.store import Store, open_store
from durabl.tools import RetryPolicy


def load_modules(names: Sequence[str]) -> dict[str, Any]:
    """Import each module; collect the runtime options they define."""
    options: dict[str, Any] = {"tools": {}, "llm": None, "retry": None}
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"cannot import module {name!r}: {exc}") from None
        except Exception as exc:  # the module's own code failed while loading
            raise UsageError(
                f"importing module {name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        options["tools"].update(getattr(module, "DURABL_TOOLS", {}) or {})
        options["llm"] = getattr(module, "DURABL_LLM", None) or options["llm"]
        retry = getattr(module, "DURABL_RETRY", None)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise UsageError(f"{name}.DURABL_RETRY must be a RetryPolicy")
        options["retry"] = retry or options["retry"]
    return options


@contextmanager
def read_store(path: str) -> Iterator[Store]:
    """The database at ``path`` (a file, or a PostgreSQL URL), read-only, closed when the block
    ends."""
    store = open_store(path, read_only=True)
    try:
        yield store
    finally:
        store.close()


def runtime(args: argparse.Namespace, store: Store | None = None) -> Runtime:
    """A runtime with the ``--import`` modules' workflows and tools, on ``store`` if given,
    else on the ``--db`` file."""
    options = load_modules(args.imports)
    if store is not None:
        return Runtime(store=store, **options)
    return Runtime(args.db, **options)
