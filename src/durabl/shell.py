"""Run shell commands as tools, so that a killed agent leaves no child still acting.

The command runs in a process group apart from the agent's (a timeout kills the whole group)
and, on Linux, is given ``PR_SET_PDEATHSIG``: when the agent process dies, even by SIGKILL, the
kernel sends the command SIGKILL too. That setting survives ``exec`` but not ``fork``, and a shell
may fork even a simple command (dash does for ``sh -c "sleep 30"``), so a guard process watches
the agent as well: it holds the read end of a pipe only the agent can write to, and when the
agent dies (end of file without a "done") it kills the command's whole process group, forked
children included. The guard is started first and leads that group, so there is no moment when
the command runs unwatched.

The step's idempotency key is in the command's environment as ``DURABL_IDEMPOTENCY_KEY``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from durabl.errors import CommandFailed, CommandTimedOut
from durabl.tools import Tool, ToolMode, tool

__all__ = ["KEY_VARIABLE", "CommandFailed", "CommandTimedOut", "run_command", "shell_tool"]

PR_SET_PDEATHSIG = 1
KEY_VARIABLE = "DURABL_IDEMPOTENCY_KEY"


def _die_with(parent_pid: int) -> None:
    """Runs in the child between fork and exec: ask for SIGKILL when the parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took hold
        os._exit(137)


def run_command(
    command: str | Sequence[str],
    *,
    timeout_s: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """Run ``command`` (a string for ``sh -c``, or an argument list) and return
    ``{"returncode", "stdout", "stderr"}``. Raises CommandTimedOut, and with ``check``
    CommandFailed for a non-zero exit."""
    full_env = {**os.environ, **(env or {})}
    if idempotency_key is not None:
        full_env[KEY_VARIABLE] = idempotency_key
    parent = os.getpid()
    guard = _guard()
    try:
        proc = subprocess.Popen(
            command,
            shell=isinstance(command, str),
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            process_group=0 if guard is None else guard.pid,
            preexec_fn=lambda: _die_with(parent),
        )
    except BaseException:
        _stand_down(guard)
        raise
    group = proc.pid if guard is None else guard.pid
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(group)
        proc.communicate()
        raise CommandTimedOut(command=command, timeout_s=timeout_s) from None
    except BaseException:
        _kill_group(group)
        raise
    finally:
        _stand_down(guard)
    if check and proc.returncode != 0:
        raise CommandFailed(command=command, returncode=proc.returncode, stderr=stderr)
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr}


_GUARD_SCRIPT = 'read -r word; [ "$word" = done ] || kill -9 -$$ 2>/dev/null'


def _guard() -> subprocess.Popen[bytes] | None:
    """A process that leads a process group of its own, which the command then joins, and
    kills the whole group if this process dies before it says "done": the pipe's write end is
    this process's alone (children do not inherit it), so its death is an end of file. It is
    started first, so that from the command's first instant there is a group to kill and a
    process watching for the agent's death."""
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", _GUARD_SCRIPT, "durabl-shell-guard"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )
    except OSError:  # no /bin/sh: PR_SET_PDEATHSIG alone still covers a command that execs
        return None


def _stand_down(guard: subprocess.Popen[bytes] | None) -> None:
    if guard is None or guard.stdin is None:
        return
    with contextlib.suppress(OSError):
        guard.stdin.write(b"done\n")
        guard.stdin.close()
    guard.wait()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def shell_tool(
    *,
    name: str = "shell",
    mode: ToolMode | str = ToolMode.AT_MOST_ONCE,
    timeout_s: float | None = None,
    cwd: str | None = None,
    check: bool = True,
    max_attempts: int | None = None,
) -> Tool:
    """A tool that runs ``ToolCall(name, {"command": ...})`` with ``run_command``."""

    def shell(command: str | list[str], *, idempotency_key: str) -> dict[str, Any]:
        return run_command(
            command, timeout_s=timeout_s, cwd=cwd, idempotency_key=idempotency_key, check=check
        )

    made: Tool = tool(shell, name=name, mode=mode, max_attempts=max_attempts)
    return made
