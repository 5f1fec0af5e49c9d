"""``Runtime``: the public facade. It checks its configuration, puts the parts together, and
hands each call to the part that owns it.

- ``durabl.engine``: starting runs, leases, and one pass through a run (``durabl.drive``,
  which executes steps through ``durabl.execute`` and writes through ``durabl.journal``);
- ``durabl.operator``: the dead-letter queue and compaction;
- ``durabl.worker``: the long-running mode;
- ``durabl.metrics``: what runs cost, folded from their logs.

Seams. Three members are meant to be overridden, and only to test the chaos harness: the
negative control's deliberately broken runtimes (``tests/chaos/broken_runtime.py``) plant each
of their bugs in exactly one of them. ``journal_class`` (the write path), ``decide`` (the
replay decision) and ``call_tool`` (handing control to a tool).

``durabl.operator``, ``durabl.metrics`` and ``durabl.worker`` are imported by the methods that
use them: starting a run needs none of them, so ``import durabl`` costs only what it does need.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from durabl import codec, events, leases, replay
from durabl.aio import AsyncRuntime
from durabl.checks import check_text, check_type
from durabl.engine import Engine, new_run_id
from durabl.errors import DeadLetteredError, RunEndedError, RunFailedError, RunNotFinishedError
from durabl.execute import Services
from durabl.journal import Journal, Writer
from durabl.modelcall import Chunk
from durabl.prices import Price, price_table
from durabl.replay import History, StepRecord
from durabl.states import DeadLetter, RunState
from durabl.steps import Step
from durabl.store import Store, open_store
from durabl.tools import RetryPolicy, Tool, build_registry
from durabl.workflow import build_registry as build_workflow_registry

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from durabl.ledger import Budget, Spend
    from durabl.metrics import Metrics
    from durabl.upkeep import Compaction, RunCheck
    from durabl.worker import Worker, WorkerStats


PARALLELISM = 8
"""How many branches of Parallel steps one runtime runs at once, over all its runs."""


class Runtime(AsyncRuntime):
    """Runs workflows durably against one database."""

    journal_class: type[Journal] = Journal
    """The journal each pass writes through (a seam: see the module docstring)."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        llm: Callable[..., Any] | None = None,
        tools: Mapping[str, Any] | None = None,
        clock: Callable[[], float] | None = None,
        retry: RetryPolicy | None = None,
        workflows: Iterable[Any] | Mapping[str, Any] | None = None,
        durability: str = "full",
        store: Store | None = None,
        lease_s: float = leases.LEASE_S,
        parallelism: int = PARALLELISM,
        prices: Mapping[str, Price] | None = None,
        on_chunk: Callable[[Chunk], None] | None = None,
        budget: Budget | None = None,
    ) -> None:
        if llm is not None and not callable(llm):
            raise TypeError(
                f"llm must be a callable llm(prompt, **params), got {type(llm).__name__}"
            )
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a zero-argument callable returning epoch seconds")
        if retry is not None:
            check_type("retry", retry, RetryPolicy)
        if budget is not None:
            _check_budget(budget)
        if on_chunk is not None and not callable(on_chunk):
            raise TypeError(f"on_chunk must be a callable on_chunk(chunk), got {on_chunk!r}")
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(
                f"parallelism must be a whole number of 1 or more, got {parallelism!r}"
            )
        # The replay decision, bound once: the core's own function unless a subclass overrides
        # the seam (a frame less on every step served).
        decide = self.decide if type(self).decide is not Runtime.decide else replay.decide
        registered_tools = build_registry(tools)
        registered_workflows = build_workflow_registry(workflows)
        self._retry = retry or RetryPolicy()
        self.instance_id = os.urandom(16).hex()  # 32 hex digits, as uuid4().hex, without uuid
        self.store: Store = (
            store
            if store is not None
            else open_store("durabl.db" if db is None else db, durability=durability)
        )
        self._leaser = leases.Leaser(self.store, self.instance_id, lease_s)
        # A database that several hosts share keeps its own clock (PostgreSQL's), by which
        # timers are armed and fired; a file on one host goes by that host's.
        user_clock: Callable[[], float] = (
            clock if clock is not None else getattr(self.store, "clock", time.time)
        )
        # The runtime reads its clock at every commit: time.time itself needs no float().
        self._clock: Callable[[], float] = (
            time.time if user_clock is time.time else lambda: float(user_clock())
        )
        self._boundary = {"pid": os.getpid(), "host": leases.HOST, "owner": self.instance_id}
        self._policies: dict[str, RetryPolicy] = {}
        self._worker: Worker | None = None
        self._parallelism = parallelism
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        services = Services(
            llm,
            registered_tools,
            self._retry,
            self._policy,
            self.call_tool,
            decide=decide,
            pool=self._branch_pool,
            stopping=lambda: self._engine.halted,
            call_model=self.call_model,
            prices=price_table(prices),
            on_chunk=on_chunk,
        )
        self._engine = Engine(
            store=self.store,
            writer=Writer(self.store, self._clock, self._boundary, self.journal_class),
            leaser=self._leaser,
            workflows=registered_workflows,
            services=services,
            decide=decide,
            clock=self._clock,
            budget=budget,
        )
        services.children = self._engine

    # -- seams -----------------------------------------------------------------------------

    def decide(self, history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
        """The replay decision for a step (a seam: see the module docstring)."""
        return replay.decide(history, position, step)

    def call_tool(self, tool: Tool, args: dict[str, Any]) -> Any:
        """Hand control to a tool: the only place durabl calls one (a seam). What an ``async
        def`` tool returns is awaited here, on an event loop (``durabl.aio``)."""
        return self._awaited(tool.fn(**args))

    def call_model(self, llm: Callable[..., Any], prompt: Any, params: dict[str, Any]) -> Any:
        """Hand control to the model client: the only place durabl calls it. What an async
        client returns is awaited here, on an event loop (``durabl.aio``)."""
        from durabl.modelcall import current  # loaded with durabl.modelcall, above

        return self._awaited(llm(prompt, **params), current())

    def _branch_pool(self) -> ThreadPoolExecutor:
        """The threads the branches of every Parallel of this runtime share (made at first use:
        most runtimes never need them)."""
        with self._pool_lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(
                    max_workers=self._parallelism, thread_name_prefix="durabl-parallel"
                )
            return self._pool

    def _policy(self, tool: Tool) -> RetryPolicy:
        policy = self._policies.get(tool.name)
        if policy is None:
            policy = self._policies[tool.name] = tool.policy(self._retry)
        return policy

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self, *, concurrency: int = 1, poll_s: float = 1.0) -> WorkerStats:
        """Run a worker on this runtime until ``stop()`` is called (from another thread or a
        signal handler): resume interrupted runs, fire timers as they come due. ``poll_s``
        defaults to ``durabl.worker.POLL_S``."""
        from durabl.worker import Worker

        worker = Worker(self._engine, concurrency=concurrency, poll_s=poll_s)
        self._worker = worker
        if self._engine.halted:
            worker.stop()
        return worker.run()

    def stop(self) -> None:
        """Ask a serving runtime to let its current steps finish, park, and return. Safe in a
        signal handler: it takes no lock and writes nothing."""
        self._engine.halt()
        if self._worker is not None:
            self._worker.stop()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._let_go_of_loop()  # durabl's private event loop stops when its last user closes
        self._leaser.close()
        self.store.close()

    def observe(
        self, observer: Callable[[str, list[events.Event], History], None]
    ) -> Callable[[], None]:
        """Call ``observer(run_id, events, history)`` after each commit of this runtime that
        appends to a run's log, with the events appended and the run's history with them
        folded in (``durabl.telemetry`` builds its spans so). It runs in the committing thread,
        and what it raises reaches the step's caller. A replay commits nothing, so it calls
        nothing. Returns a function that removes it."""
        observers = self._engine.writer.observers
        observers.append(observer)
        return lambda: observers.remove(observer) if observer in observers else None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------

    def start(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Create a run and drive it as far as it goes; returns its id.

        Starting again with an existing run id and the same workflow and input returns that run
        (driving it on if it was interrupted); with a different workflow or input it is an error.
        ``budget`` (default: the runtime's) bounds what the run and the runs it starts spend on
        models (``durabl.ledger.Budget``); it is recorded with the run.
        """
        if run_id is None:
            run_id = new_run_id()  # the id of the run made here, wherever a chain goes from it
        self.run(workflow, input, run_id=run_id, budget=budget)
        return run_id

    def submit(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Create a run without driving it, for a worker (``durabl worker``, ``serve``) to
        claim; returns its id. On PostgreSQL the workers are woken at once and divide the
        submitted runs between them. Submitting again with the same run id, workflow and input
        is the same submission; with a different workflow or input it is an error."""
        if budget is not None:
            _check_budget(budget)
        return self._engine.submit(workflow, input, run_id, self._boundary, budget)

    def run(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> RunState:
        """``start``, and return the state the run reached."""
        if budget is not None:
            _check_budget(budget)
        return self._engine.start(workflow, input, run_id, self._boundary, budget)

    def signal(self, run_id: str, name: str, payload: Any = None) -> int:
        """Send ``payload`` to the run, for its ``WaitSignal(name)``: kept durably until a
        wait for ``name`` takes it (at once if the run waits for it now, else the first such
        wait it reaches), and taken once. A waiting run is made due at once, so a worker (or
        ``tick``) drives it on; this call only records. Returns the signal's number in the run.
        ``RunNotFoundError`` for an unknown run, ``RunEndedError`` for one that has ended, and
        ``EncodingError`` for a payload that is not JSON; nothing is written then."""
        check_text("name", name)
        text, _ = codec.round_trip(payload, what=f"the payload of signal {name!r} to run {run_id}")
        while True:  # to the run a ContinueAsNew chain has got to, which may move on meanwhile
            target = self._engine.latest(run_id)
            try:
                return self.store.send_signal(target, name, text, self._clock())
            except RunEndedError as ended:
                if ended.status != events.CONTINUED:
                    raise

    def resume(self, run_id: str) -> RunState:
        """Drive an existing run on from where its log ends."""
        return self._engine.resume(self._engine.row(run_id))

    def resume_all(self) -> list[RunState]:
        """Resume every interrupted or held run. One broken run is reported and skipped."""
        rows = self.store.list_runs(statuses=(events.RUNNING, events.HELD))
        return [self._engine.resume_isolated(row, None) for row in reversed(rows)]

    def tick(self, now: float | None = None) -> list[RunState]:
        """Fire every timer due at ``now`` (default: the clock) and drive those runs on."""
        now_s = self._clock() if now is None else float(now)
        states = []
        for run_id in self.store.due_runs(now_s):
            row = self.store.get_run(run_id)
            if row is not None and row.status not in events.TERMINAL_STATUSES:
                states.append(self._engine.resume_isolated(row, now_s))
        return states

    def replay(self, run_id: str, *, dry: bool = True) -> RunState:
        """Rebuild the run's state from its log. ``dry`` (the default) executes and writes
        nothing, even when the log ends mid-step; ``dry=False`` is ``resume``."""
        if not dry:
            return self.resume(run_id)
        row = self._engine.row(run_id)
        drive = self._engine.drive(row, self._engine.workflow_of(row.workflow), None, None)
        return self._engine.state_of(drive, row)

    # -- reading ---------------------------------------------------------------------------

    def state(self, run_id: str) -> RunState:
        """The run's state as recorded (no workflow code runs)."""
        return self._engine.state(run_id)

    def spend(self, run_id: str) -> Spend:
        """What the run and every run it started (its child runs, the runs it continued as,
        theirs in turn) spent on models, from their logs: tokens, dollars, and the answers of
        models with no price, whose cost is unknown."""
        from durabl.ledger import spend

        return spend(self.store, self._engine.row(run_id).run_id)

    def current(self, run_id: str) -> str:
        """The id of the run a chain of ``ContinueAsNew`` started at (or passing through)
        ``run_id`` has got to: ``run_id`` itself unless it continued. ``RunNotFoundError`` for
        an unknown run."""
        return self._engine.latest(run_id)

    def result(self, run_id: str) -> Any:
        """The run's result; raises if the run failed, was cancelled or has not finished."""
        row = self._engine.row(run_id)
        if row.status == events.COMPLETED:
            return codec.decode_or_none(row.result_text)
        if row.status == events.FAILED:
            raise RunFailedError(run_id=run_id, error=row.error)
        if row.status == events.DEAD_LETTERED:
            raise DeadLetteredError(run_id=run_id, reason=row.error)
        raise RunNotFinishedError(run_id=run_id, status=row.status)

    def metrics(self, run_id: str | None = None) -> Metrics:
        """What the run cost (or, with ``run_id`` None, the sums over every run), from the log
        alone: see ``durabl.metrics``."""
        from durabl.metrics import of_runs

        run_ids = [self._engine.row(run_id).run_id] if run_id is not None else None
        return of_runs(self.store, run_ids)

    # -- operating -------------------------------------------------------------------------

    def check(self) -> list[RunCheck]:
        """Replay every stored run against this runtime's workflows, dry, oldest first: what a
        deploy of this code would do to the runs in the database, before it is deployed. Calls
        nothing and writes nothing. A run breaks when it is not finished and its replay differs
        from its log (the first difference is named) or cannot run at all (its workflow is not
        registered, say)."""
        from durabl import operator

        return operator.check(self._engine)

    def fork(self, run_id: str, at_seq: int, *, new_run_id: str | None = None) -> str:
        """A new run whose log is ``run_id``'s up to ``at_seq``, the seq that ends a step: run
        on (``resume``, or any worker), it serves steps 1..N from the copied log and goes on
        with the code deployed now, so an agent is re-run from step N+1 with a new prompt or
        model without paying for the steps before. Its RUN_STARTED names where it came from.
        ``ForkRefusedError`` (naming the run, the seq and the step) for a seq the log does not
        hold, one inside a step, the run's end, or a compacted run; nothing is written then."""
        from durabl import operator

        check_type("at_seq", at_seq, int)
        return operator.fork(self._engine, run_id, at_seq, new_run_id, self._boundary)

    def dead_letters(self) -> list[DeadLetter]:
        """Every run stopped on a dead-lettered step, oldest first."""
        from durabl import operator

        return operator.dead_letters(self._engine)

    def redrive(self, run_id: str) -> RunState:
        """Call the dead-lettered step again (the operator accepts a possible duplicate)."""
        from durabl import operator

        return operator.redrive(self._engine, run_id)

    def resolve(self, run_id: str, result: Any) -> RunState:
        """Supply the dead-lettered step's result (the operator checked what happened)."""
        from durabl import operator

        return operator.resolve(self._engine, run_id, result)

    def cancel(self, run_id: str, reason: str = "cancelled by operator") -> RunState:
        """End a run that has not finished. Recorded in the log; the run never resumes."""
        from durabl import operator

        return operator.cancel(self._engine, run_id, reason)

    def compact(
        self, run_id: str | None = None, *, keep_last: int = 0, reclaim: bool = True
    ) -> Compaction:
        """Fold each run's resolved prefix (its finished steps, less the last ``keep_last``)
        into its snapshot, one transaction per run; then, with ``reclaim``, hand the freed
        space back to the file system. ``run_id`` None means every run; then a run another
        live process is driving is skipped (listed in ``busy``), and a run that cannot be
        folded (listed in ``errors``) does not stop the others. Replay is unchanged either way."""
        from durabl import operator

        return operator.compact(self._engine, run_id, keep_last, reclaim)


__all__ = ["DeadLetter", "RunState", "Runtime"]


def _check_budget(budget: Any) -> None:
    """TypeError unless ``budget`` is a ``Budget``; ``durabl.ledger`` is imported by the
    first run that has one, not by ``import durabl``."""
    from durabl.ledger import Budget

    check_type("budget", budget, Budget)
