"""``durabl.shell`` with real processes (SPEC §7): commands die with their agent and with their
timeout, see their step's idempotency key, and fail loudly.

Every command that must die carries a unique marker argument (``sleep 30.<digits>``) so the test
can look for it in ``/proc/*/cmdline`` and find nothing else.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proc_support import env_for, log_of, pids_with_argument, processes, query, wait_until

from durabl import Runtime, ToolCall, ToolFailed, workflow
from durabl.shell import CommandFailed, CommandTimedOut, run_command, shell_tool
from durabl.steps import derived_key

_serial = itertools.count(1)


def marker() -> str:
    """A sleep duration no other process on the machine is using."""
    return f"30.{os.getpid()}{next(_serial):03d}{int(time.time() * 1000) % 100000:05d}"


def argv_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def sleepers(mark: str) -> list[int]:
    return [pid for pid in pids_with_argument(mark) if argv_of(pid)[:1] == ["sleep"]]


def none_left(mark: str, within_s: float = 5.0) -> list[int]:
    """Poll for a short while until no live process carries ``mark``; returns what is left."""
    deadline = time.monotonic() + within_s
    while (left := pids_with_argument(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_leftovers(mark: str) -> None:
    for pid in pids_with_argument(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


COMMANDS = {
    "argument_list": lambda mark: ["sleep", mark],  # exec'd directly
    "shell_string": lambda mark: f"sleep {mark}",  # sh -c; dash forks even a simple command
    "compound": lambda mark: f"sleep {mark}; echo too late",  # sh -c forks the sleep
}


@pytest.mark.parametrize("form", sorted(COMMANDS))
def test_a_sigkilled_agent_leaves_no_shell_command_behind(tmp_path: Path, form: str) -> None:
    mark = marker()
    command = COMMANDS[form](mark)
    db = tmp_path / "shell.db"
    run_input = json.dumps({"command": command})
    try:
        with processes() as procs:
            agent = procs.agent(
                env_for(tmp_path), "start", str(db), "wa_shell", "sh-1", "--input", run_input
            )
            (child,) = wait_until("the agent's command to run", lambda: sleepers(mark))
            assert os.getpgid(child) != os.getpgid(agent.pid), "not in its own process group"
            agent.kill()
            agent.wait(timeout=10)
            assert agent.returncode == -signal.SIGKILL
        assert none_left(mark) == [], "the killed agent's command is still running"
    finally:
        kill_leftovers(mark)
    # The shell tool is IDEMPOTENT with a derived key: its step is committed in one transaction
    # once the command returns, so the kill left nothing of it, and a resume runs it again.
    kinds = [kind for _, kind, *_ in log_of(db, "sh-1")]
    assert kinds == ["RUN_STARTED"]
    assert query(db, "SELECT status FROM runs WHERE run_id = ?", ("sh-1",)) == [("RUNNING",)]


def test_a_timeout_kills_the_whole_process_group() -> None:
    first, second = marker(), marker()
    raised: list[BaseException] = []

    def call() -> None:
        try:
            run_command(f"sleep {first} & sleep {second}; wait", timeout_s=3)
        except BaseException as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        wait_until("both commands to run", lambda: sleepers(first) and sleepers(second))
        caller.join(timeout=20)
        assert not caller.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], CommandTimedOut), raised
        assert "3 s" in str(raised[0])
        assert none_left(first) == [], "the command was left running"
        assert none_left(second) == [], "the background child was left running"
    finally:
        kill_leftovers(first)
        kill_leftovers(second)


def test_the_command_joins_a_group_its_guard_already_leads() -> None:
    # The guard is started before the command and leads the group the command joins: from the
    # command's first instant, something watches the agent and can kill the group. (Started
    # after it, the guard left a moment in which a shell's forked child outlived a SIGKILLed
    # agent.)
    mark = marker()
    command = f"sleep {mark}; echo done"
    caller = threading.Thread(target=run_command, args=(command,), kwargs={"check": False})
    try:
        caller.start()
        (child,) = wait_until("the command to run", lambda: sleepers(mark))
        leader = os.getpgid(child)
        assert leader != os.getpgid(0)
        assert "durabl-shell-guard" in argv_of(leader)
    finally:
        kill_leftovers(mark)
        caller.join(timeout=20)
    assert not caller.is_alive()


def test_a_failing_command_raises_naming_its_exit_code() -> None:
    with pytest.raises(CommandFailed, match=r"exited with 3: boom"):
        run_command("echo boom >&2; exit 3")
    with pytest.raises(CommandFailed, match=r"exited with 4"):
        run_command(["sh", "-c", "exit 4"], check=True)
    assert run_command("exit 5", check=False)["returncode"] == 5


@workflow(name="sh_keyed")
def keyed(ctx: Any) -> Any:
    command = ["sh", "-c", 'printf %s "$DURABL_IDEMPOTENCY_KEY"']
    derived = yield ToolCall("shell", {"command": command})
    explicit = yield ToolCall("shell", {"command": command}, idempotency_key=f"deploy-{ctx.run_id}")
    return [derived["stdout"], explicit["stdout"]]


@workflow(name="sh_failing")
def failing(ctx: Any) -> Any:
    try:
        yield ToolCall("strict", {"command": "echo oops >&2; exit 7"})
    except ToolFailed as failed:
        return {"error_type": failed.error_type, "message": failed.message}
    return "unreachable"


@workflow(name="sh_counted")
def counted(ctx: Any, ledger: str) -> Any:
    out = yield ToolCall("shell", {"command": ["sh", "-c", f"echo ran >> {ledger}; pwd"]})
    again = yield ToolCall("shell", {"command": "echo hello"})
    return {"cwd": out["stdout"].strip(), "hello": again["stdout"], "code": again["returncode"]}


def shell_runtime(db: Path, cwd: Path | None = None) -> Runtime:
    return Runtime(
        db,
        tools={
            "shell": shell_tool(
                name="shell", mode="IDEMPOTENT", cwd=None if cwd is None else str(cwd)
            ),
            "strict": shell_tool(name="strict", max_attempts=1),
        },
    )


def test_the_command_sees_its_steps_idempotency_key(tmp_path: Path) -> None:
    db = tmp_path / "shell.db"
    with shell_runtime(db) as rt:
        state = rt.run(keyed, run_id="keyed-1")
    assert state.status == "COMPLETED"
    # An explicit key is recorded in its TOOL_DISPATCHED; a derived one is the run's id and
    # the step's position, and its IDEMPOTENT step is one TOOL_COMPLETED.
    dispatched = [
        json.loads(data or "{}")["key"]
        if kind == "TOOL_DISPATCHED"
        else derived_key("keyed-1", step)
        for _, kind, step, data, *_ in log_of(db, "keyed-1")
        if kind in ("TOOL_DISPATCHED", "TOOL_COMPLETED")
    ]
    assert state.result == dispatched == [derived_key("keyed-1", 1), "deploy-keyed-1"]


def test_a_failing_command_is_a_tool_failure_in_a_workflow(tmp_path: Path) -> None:
    with shell_runtime(tmp_path / "shell.db") as rt:
        state = rt.run(failing, run_id="fail-1")
    assert state.status == "COMPLETED"
    assert state.result["error_type"] == "CommandFailed"
    assert "exited with 7: oops" in state.result["message"]


def test_shell_tool_runs_once_inside_a_workflow(tmp_path: Path) -> None:
    db = tmp_path / "shell.db"
    ledger = tmp_path / "ledger.txt"
    work = tmp_path / "work"
    work.mkdir()
    with shell_runtime(db, cwd=work) as rt:
        state = rt.run(counted, {"ledger": str(ledger)}, run_id="counted-1")
        assert state.status == "COMPLETED"
        assert state.result == {"cwd": str(work), "hello": "hello\n", "code": 0}
        assert rt.replay("counted-1").result == state.result  # from the log, running nothing
        assert rt.resume("counted-1").result == state.result
    assert ledger.read_text() == "ran\n"
