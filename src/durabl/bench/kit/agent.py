"""The benchmark's agent, and the child's side of the harness protocol.

This module runs inside every adapter's process, in every peer's virtualenv, so it imports the
standard library only. It holds three things:

- **The workload**: seven steps, the same for every runtime (``STEPS``). Each step is a pure
  computation (``compute``) followed by its effect on the outside world (files in the trial's
  ``effects`` folder). Because the computations are pure, the final result and every effect are
  known in advance (``expected_result``, ``expected_tokens``).
- **The kill windows**: ``Trial.arrive(window)`` marks an instant inside PROMPT, EXEC, WRITE or
  VERIFY. The harness names one arrival to die at; the child announces it and waits for SIGKILL.
- **The announcements**: one JSON line per event on the pipe the harness passed in, each stamped
  with ``time.monotonic()``, which every process on the machine reads from the same clock.

An adapter script (``run_<runtime>.py`` beside this file) maps ``STEPS`` onto its runtime's own
constructs, calls ``Trial.run_step`` for each step's body, and ends with ``Trial.finish``.

Environment the harness sets:
  ``DURABL_BENCH_TRIAL``  the trial folder (``store/`` for the runtime, ``effects/`` for effects)
  ``DURABL_BENCH_FD``     the pipe to announce on
  ``DURABL_BENCH_KILL``   ``WINDOW:N``: die at the N-th arrival at WINDOW in this process (absent
                          on restarts and calibration runs)
  ``DURABL_BENCH_TAG``    a token every process of the trial inherits: after a kill, any live
                          process still carrying it is an orphan
  ``DURABL_BENCH_SERVICE`` the address of a service the harness keeps up across kills (Temporal)

Exit codes: 0 the run completed and was verified; 3 the runtime holds the run for an operator
(dead-lettered); 4 the runtime reports the run failed. Anything else is a crash and the harness
restarts the runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKLOAD = "research-agent/1"
WINDOWS = ("PROMPT", "EXEC", "WRITE", "VERIFY")
TOPIC = "sea otters"
RECIPIENT = "reader@example.com"
SHELL_SLEEP_S = 0.3
"""How long the shell tool's child runs; an EXEC kill lands while it does."""

TAG_VARIABLE = "DURABL_BENCH_TAG"
HELD = 3
FAILED = 4


@dataclass(frozen=True)
class StepSpec:
    """One step of the workload.

    ``kind`` is "model" or "tool". ``effect`` says what running it twice does to the world:
    "none" (a model call: tokens billed again), "idempotent" (overwrites the same file),
    "once" (appends a line: a second run is a duplicated effect) or "keyed" (appends a line unless
    the idempotency key the runtime passes is already there; without a key, like "once").
    """

    name: str
    kind: str
    effect: str


STEPS = (
    StepSpec("plan", "model", "none"),
    StepSpec("search_habitat", "tool", "idempotent"),
    StepSpec("search_diet", "tool", "idempotent"),
    StepSpec("ledger", "tool", "once"),
    StepSpec("shell", "tool", "idempotent"),
    StepSpec("draft", "model", "none"),
    StepSpec("send", "tool", "keyed"),
)
STEP_NAMES = tuple(step.name for step in STEPS)
SPECS = {step.name: step for step in STEPS}


# -- the pure part of the workload -----------------------------------------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def step_input(name: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """The input of step ``name`` given the outputs of the steps before it (JSON-serialisable;
    every adapter passes exactly this to the step)."""
    if name == "plan":
        return {"topic": TOPIC}
    if name in ("search_habitat", "search_diet"):
        return {"query": outputs["plan"]["queries"][name.removeprefix("search_")]}
    if name == "ledger":
        return {"topic": TOPIC, "sources": _sources(outputs)}
    if name == "shell":
        return {"text": outputs["plan"]["text"]}
    if name == "draft":
        return {
            "findings": [outputs["search_habitat"], outputs["search_diet"]],
            "digest": outputs["shell"]["digest"],
        }
    if name == "send":
        return {"to": RECIPIENT, "body": outputs["draft"]["text"]}
    raise KeyError(f"unknown step {name!r}")


def _sources(outputs: dict[str, Any]) -> int:
    return len(outputs["search_habitat"]["results"]) + len(outputs["search_diet"]["results"])


def assemble_prompt(name: str, data: dict[str, Any]) -> str:
    """The context a model call sees, built from its input (the PROMPT window's work)."""
    if name == "plan":
        return f"Plan research on {data['topic']}: name one query per angle (habitat, diet)."
    findings = "\n".join(
        f"- {found['query']}: {'; '.join(found['results'])}" for found in data["findings"]
    )
    return f"Draft a summary from these findings (digest {data['digest'][:12]}):\n{findings}"


def answer(name: str, prompt: str) -> dict[str, Any]:
    """The stub model: the same prompt always gets the same answer and the same token usage."""
    words = len(prompt.split())
    if name == "plan":
        queries = {"habitat": f"{TOPIC} habitat", "diet": f"{TOPIC} diet"}
        text = f"Research {TOPIC}: {queries['habitat']}; {queries['diet']}."
        return {
            "text": text,
            "queries": queries,
            "usage": {"prompt_tokens": words, "completion_tokens": len(text.split())},
        }
    text = f"Summary ({_digest(prompt)[:8]}): " + " ".join(prompt.split()[5:25])
    return {"text": text, "usage": {"prompt_tokens": words, "completion_tokens": len(text.split())}}


def compute(name: str, data: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """What step ``name`` returns for ``data``, without touching the world."""
    if name in ("plan", "draft"):
        return answer(name, assemble_prompt(name, data))
    if name.startswith("search_"):
        return {"query": data["query"], "results": [f"{data['query']}: source {n}" for n in (1, 2)]}
    if name == "ledger":
        return {"entry": 1, "topic": data["topic"], "sources": data["sources"]}
    if name == "shell":
        return {"digest": hashlib.sha256(data["text"].encode()).hexdigest()}
    if name == "send":
        return {"message_id": _digest({"to": data["to"], "body": data["body"]})[:16]}
    raise KeyError(f"unknown step {name!r}")


def expected_outputs() -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for name in STEP_NAMES:
        outputs[name] = compute(name, step_input(name, outputs))
    return outputs


def final_result(outputs: dict[str, Any]) -> dict[str, Any]:
    """The run's result: what the workflow returns after its last step."""
    return {
        "summary": outputs["draft"]["text"],
        "ledger_entry": outputs["ledger"]["entry"],
        "digest": outputs["shell"]["digest"],
        "message_id": outputs["send"]["message_id"],
    }


def expected_result() -> dict[str, Any]:
    return final_result(expected_outputs())


def expected_tokens() -> int:
    """The tokens one clean run bills: every model call exactly once."""
    outputs = expected_outputs()
    return sum(
        outputs[s.name]["usage"]["prompt_tokens"] + outputs[s.name]["usage"]["completion_tokens"]
        for s in STEPS
        if s.kind == "model"
    )


# -- the child's side of the protocol --------------------------------------------------------


def _append_line(path: Path, record: dict[str, Any]) -> int:
    """Append one JSON line with O_APPEND and fsync it; returns the file's line count after."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(read_lines(path))


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


ShellRunner = Callable[[list[str]], int]
"""How a runtime runs the shell tool's command: start ``argv``, wait, return its exit code."""


def plain_shell(argv: list[str]) -> int:
    """subprocess.run, as a tool written without a runtime's help would."""
    return subprocess.run(argv, check=False).returncode


class Trial:
    """This process's view of its trial: folders, the pipe, the kill target, arrival counts."""

    def __init__(self, root: Path, fd: int | None, kill: str | None) -> None:
        self.root = root
        self.store = root / "store"
        self.effects = root / "effects"
        self.store.mkdir(parents=True, exist_ok=True)
        self.effects.mkdir(parents=True, exist_ok=True)
        self._pipe = os.fdopen(fd, "w", buffering=1) if fd is not None else None
        self.kill_window, self.kill_at = (None, 0)
        if kill:
            window, _, n = kill.partition(":")
            self.kill_window, self.kill_at = window, int(n)
        self.arrivals = dict.fromkeys(WINDOWS, 0)
        self.service = os.environ.get("DURABL_BENCH_SERVICE")
        self.shell_runner: ShellRunner = plain_shell
        self.started_at = time.monotonic()

    @classmethod
    def from_env(cls) -> Trial:
        fd = os.environ.get("DURABL_BENCH_FD")
        trial = cls(
            Path(os.environ["DURABL_BENCH_TRIAL"]),
            int(fd) if fd else None,
            os.environ.get("DURABL_BENCH_KILL"),
        )
        trial.announce("start", pid=os.getpid())
        return trial

    # announcements

    def announce(self, event: str, **fields: Any) -> None:
        if self._pipe is None:
            return
        line = json.dumps({"event": event, "t": time.monotonic(), **fields}, sort_keys=True)
        try:
            self._pipe.write(line + "\n")
        except BrokenPipeError:  # the harness is gone: nobody to report to
            os._exit(70)

    def ready(self, *, runtime: str, version: str, import_s: float, init_s: float) -> None:
        """After the runtime is imported and set up, before the run is started or resumed."""
        self.announce("ready", runtime=runtime, version=version, import_s=import_s, init_s=init_s)

    def arrive(self, window: str) -> None:
        """An instant inside ``window``. At the chosen arrival: announce it and wait to die."""
        self.arrivals[window] += 1
        n = self.arrivals[window]
        if window == self.kill_window and n == self.kill_at:
            self.announce("kill", window=window, n=n)
            while True:  # the harness sends SIGKILL now
                time.sleep(60)

    # the workload's step bodies

    def run_step(self, name: str, data: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """Execute step ``name`` for real: its computation, its kill windows, its effect."""
        self.announce("step", name=name)
        spec = SPECS[name]
        if spec.kind == "model":
            out = self._model(name, data)
        elif name.startswith("search_"):
            out = compute(name, data)
            _replace(self.effects / f"{name}.json", json.dumps(out, sort_keys=True).encode())
            self.arrive("EXEC")
        elif name == "ledger":
            out = compute(name, data)
            out["entry"] = _append_line(self.effects / "ledger.log", {"pid": os.getpid(), **data})
            self.arrive("EXEC")  # the effect happened; the runtime has not heard back
        elif name == "shell":
            out = self._shell(data)
        elif name == "send":
            out = self._send(data, key)
        else:
            raise KeyError(f"unknown step {name!r}")
        self.announce("step_done", name=name)
        return out

    def _model(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        self.arrive("PROMPT")
        prompt = assemble_prompt(name, data)
        self.arrive("PROMPT")
        out = answer(name, prompt)
        usage = out["usage"]
        _append_line(
            self.effects / "tokens.log",
            {
                "step": name,
                "pid": os.getpid(),
                "tokens": usage["prompt_tokens"] + usage["completion_tokens"],
            },
        )
        return out

    def _shell(self, data: dict[str, Any]) -> dict[str, Any]:
        """Run a shell child that works for SHELL_SLEEP_S, then writes its digest. The EXEC
        arrival is on a watcher thread, as soon as the child has written its pid: the kill lands
        while the child runs, whatever the runtime does to start it."""
        out_file = self.effects / "shell.out"
        pids = self.effects / "shell.pids"
        script = (
            f'echo $$ >> "$3"; sleep {SHELL_SLEEP_S}; '
            'printf %s "$1" | sha256sum | cut -c1-64 > "$2.tmp" && mv "$2.tmp" "$2"'
        )
        argv = ["sh", "-c", script, "sh", data["text"], str(out_file), str(pids)]
        before = _count_lines(pids)
        watcher = threading.Thread(target=self._when_started, args=(pids, before), daemon=True)
        watcher.start()
        code = self.shell_runner(argv)
        watcher.join()
        if code != 0:
            raise RuntimeError(f"shell tool exited {code}")
        return {"digest": out_file.read_text().strip()}

    def _when_started(self, pids: Path, before: int) -> None:
        deadline = time.monotonic() + 30
        while _count_lines(pids) <= before and time.monotonic() < deadline:
            time.sleep(0.001)
        self.arrive("EXEC")  # the child is running

    def _send(self, data: dict[str, Any], key: str | None) -> dict[str, Any]:
        outbox = self.effects / "outbox.log"
        out = compute("send", data)
        if key is None or not any(line.get("key") == key for line in read_lines(outbox)):
            _append_line(outbox, {"key": key, "pid": os.getpid(), **data})
        self.arrive("EXEC")  # sent; the answer has not reached the runtime
        return out

    # the end of a run

    def finish(self, result: dict[str, Any]) -> None:
        """Verify the run's result and write the verdict, under the verdict lock, then exit 0.

        The lock is a file holding its owner's pid; a lock whose owner is dead is taken over. A
        kill here leaves the lock and a partial verdict behind: the next process must cope."""
        self.announce("run_end")
        lock = self.effects / "verify.lock"
        self._take(lock)
        self.arrive("VERIFY")
        verdict = {
            "result": result,
            "matches": result == expected_result(),
            "pid": os.getpid(),
        }
        body = json.dumps(verdict, sort_keys=True).encode()
        tmp = self.effects / "verdict.json.tmp"
        with open(tmp, "wb") as f:
            f.write(body[: len(body) // 2])
            f.flush()
            self.arrive("VERIFY")
            f.write(body[len(body) // 2 :])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.effects / "verdict.json")
        lock.unlink()
        self.announce("verified", matches=verdict["matches"], arrivals=self.arrivals)
        self.close()
        sys.exit(0)

    def _take(self, lock: Path) -> None:
        while True:
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    owner = int(lock.read_text() or "0")
                except (OSError, ValueError):
                    owner = 0
                if owner and _alive(owner):
                    time.sleep(0.01)
                    continue
                self.announce("lock_stolen", owner=owner)
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return

    def held(self, reason: str) -> None:
        """The runtime stopped the run for an operator (dead-lettered): exit 3."""
        self.announce("held", reason=reason, arrivals=self.arrivals)
        self.close()
        sys.exit(HELD)

    def failed(self, reason: str) -> None:
        """The runtime reports the run failed: exit 4."""
        self.announce("failed", reason=reason, arrivals=self.arrivals)
        self.close()
        sys.exit(FAILED)

    def close(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(BrokenPipeError):
                self._pipe.flush()

    # help for adapters whose runtime persists in SQLite

    def watch_sqlite_commits(self, ignore_threads: Collection[str] = ()) -> None:
        """Arrive at WRITE on every COMMIT of a transaction that wrote, on every SQLite
        connection opened from now on: the kill lands after the step's rows are written and
        before they are durable. Call it before the runtime opens its database. Statements run
        on a thread named in ``ignore_threads`` (a runtime's timed housekeeping) are left out."""
        trial = self

        def trace(connection_state: dict[str, bool]) -> Callable[[str], None]:
            def on_statement(sql: str) -> None:
                if ignore_threads and threading.current_thread().name in ignore_threads:
                    return
                head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
                if head in ("BEGIN", "SAVEPOINT"):
                    connection_state["open"] = True
                elif head in ("INSERT", "UPDATE", "DELETE", "REPLACE", "UPSERT"):
                    # a write outside a transaction commits by itself, atomically: no instant
                    # between its rows and its commit to kill at
                    if connection_state.get("open"):
                        connection_state["dirty"] = True
                elif head in ("COMMIT", "END"):
                    wrote = connection_state.get("dirty", False)
                    connection_state.update(open=False, dirty=False)
                    if wrote:
                        trial.arrive("WRITE")
                elif head == "ROLLBACK":
                    connection_state.update(open=False, dirty=False)

            return on_statement

        original = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = original(*args, **kwargs)
            conn.set_trace_callback(trace({}))
            return conn

        sqlite3.connect = connect  # type: ignore[assignment]
        sqlite3.dbapi2.connect = connect  # type: ignore[assignment]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def sqlite_whole(path: Path) -> tuple[bool, str]:
    """Whether a SQLite file passes its own integrity check, opened read-only."""
    if not path.exists():
        return True, "no database yet"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as exc:
        return False, f"{path.name}: {exc}"
    finally:
        conn.close()
    return rows == ["ok"], f"{path.name}: {'; '.join(rows)[:200]}"


def check_main(check: Callable[[Trial], tuple[bool, str]]) -> None:
    """``run_<runtime>.py --check``: print whether the runtime's store is whole, as JSON."""
    trial = Trial(Path(os.environ["DURABL_BENCH_TRIAL"]), None, None)
    whole, detail = check(trial)
    print(json.dumps({"whole": whole, "detail": detail}))


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the seconds the block took."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)
