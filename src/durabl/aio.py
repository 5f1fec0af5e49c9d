"""Async at the edges: ``async def`` workflows, tools and model clients, and the awaitable API
of ``Runtime`` (``AsyncRuntime``, which it inherits).

The durable core (the drive, the journal, the store) stays synchronous and runs in threads:
sqlite3 and psycopg block, and a commit's fsync must never stall an event loop. What is async
meets it in three places, all in this module:

- ``AsyncRuntime``: ``await rt.arun(...)`` and the rest run the sync method in a thread
  (``asyncio.to_thread``) and note the caller's running loop in a context variable, which that
  thread inherits, and a worker's drive threads after it (``durabl.worker`` copies it).
- ``AsyncSteps``: the drive runs an async workflow through this adapter, which advances the
  async generator (``asend``/``athrow``) as a task on an event loop and hands back each step
  it yields: the drive's one send/throw loop is the same for both kinds.
- ``AsyncRuntime._awaited``: what a tool or the model client returns, when it is awaitable, is
  run to completion before ``Runtime.call_tool``/``call_model`` return, so the executors, the
  retries and the log never see an awaitable.

Where an awaitable runs: on the caller's loop when the call came in through the async API, so a
client made on that loop (an ``AsyncOpenAI``) is used on it; otherwise (``rt.run``, a sync
worker) on durabl's private loop, a daemon thread started at first need and stopped when the
last runtime that used it is closed. A task runs in a copy of the context of the thread that
waits for it, so ``durabl.llm.current()`` is seen inside an async model client. That thread
does not sit idle: it serves what the task hands back to it (``_Inbox``), the value a
workflow's ``await ctx.now()`` records and the text a streaming client records, so that every
write is made by the thread driving the run, never on the loop.

``asyncio``, ``queue`` and ``concurrent.futures`` are imported where used: ``import durabl``
imports this module (``Runtime`` inherits the mixin) and needs none of them.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio
    import queue

    from durabl.context import Context
    from durabl.states import RunState

T = TypeVar("T")
Stats = TypeVar("Stats", covariant=True)

_CALLER: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "durabl_caller_loop", default=None
)
"""The running loop of the async API call this thread works for (set in the call's thread)."""
_INBOX: contextvars.ContextVar[_Inbox | None] = contextvars.ContextVar("durabl_inbox", default=None)
"""Where a task run by ``_wait_on`` hands work back to the thread waiting for it."""


class Return:
    """What an async workflow yields to return its result: ``yield Return(summary)``. (An async
    generator cannot ``return`` a value.) As after a ``return``, nothing after it runs: the
    body's ``finally`` blocks run and the run completes with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Return({self.value!r})"


# -- running an awaitable from a durabl thread ---------------------------------------------


class _Inbox:
    """What a task on an event loop hands back to the durabl thread waiting for it: work to do
    in that thread (a ctx value to record, streamed text to record), in the order handed."""

    def __init__(self) -> None:
        import queue  # only async calls need it

        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.failure: Exception | None = None
        """The first failure of work handed over with ``later``, raised once the task ends."""

    def hand(self, work: Callable[[], None]) -> None:
        """Have ``work`` done by the waiting thread (from any thread; never waits)."""
        self._work.put(work)

    def later(self, record: Callable[[str], None]) -> Callable[[str], None]:
        """``record``, done by the waiting thread instead of the caller, which does not wait
        for it (the loop must not wait for a write)."""

        def handed(text: str) -> None:
            self.hand(lambda: self._keep_failure(record, text))

        return handed

    def _keep_failure(self, record: Callable[[str], None], text: str) -> None:
        try:
            record(text)
        except Exception as exc:
            self.failure = self.failure or exc

    def serve(self) -> None:
        """Do the work handed over, until ``end``."""
        while (work := self._work.get()) is not None:
            work()

    def end(self) -> None:
        self._work.put(None)


def _wait_on(
    loop: asyncio.AbstractEventLoop,
    awaitable: Awaitable[T],
    context: contextvars.Context,
    inbox: _Inbox,
) -> T:
    """Run ``awaitable`` to its end as a task on ``loop`` (which another thread runs), in
    ``context``, serving ``inbox`` meanwhile; return what it returns, raise what it raises.

    ``asyncio.run_coroutine_threadsafe`` would copy the context as well, but takes no context to
    run in: an async workflow's steps must all run in one, so that a context variable it sets
    before a ``yield`` is still set after it. A task cancelled (its loop shutting down, say)
    raises ``CancelledError``, a BaseException, so that no attempt records it as the call's
    failure: the pass ends as at a crash, and the run resumes from its log."""
    import asyncio

    if _running_loop() is loop:
        _discard(awaitable)
        raise RuntimeError(
            "durabl cannot run an awaitable on the event loop of the thread that would wait "
            "for it: from async code, call the async API (await rt.arun(...) and the like)"
        )
    context.run(_INBOX.set, inbox)
    ended: list[asyncio.Future[T]] = []

    def start() -> None:
        try:
            task: asyncio.Future[T] = loop.create_task(_awaited(awaitable), context=context)
        except BaseException as exc:
            task = loop.create_future()
            task.set_exception(exc)
        ended.append(task)
        task.add_done_callback(lambda _: inbox.end())

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:  # the loop is closed: nothing ran
        _discard(awaitable)
        raise asyncio.CancelledError(f"the event loop {loop!r} is closed") from None
    inbox.serve()
    task = ended[0]
    if task.cancelled():
        raise asyncio.CancelledError("the task running the call was cancelled")
    failure = task.exception()
    if failure is not None:
        raise failure
    if inbox.failure is not None:
        raise inbox.failure
    return task.result()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run (so Python does not warn it was never awaited)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def caller_loop() -> asyncio.AbstractEventLoop | None:
    """The running loop of the async API call this thread works for, if this thread can wait
    on it (it is not the loop's own thread, calling the sync API from inside a coroutine)."""
    loop = _CALLER.get()
    if loop is None or loop.is_closed() or _running_loop() is loop:
        return None
    return loop


async def _in_drive(value: Callable[[], T]) -> T:
    """``value()``, done by the durabl thread driving this workflow, awaited here without
    blocking the loop; its exception (a ``ProcessDeath``, an ``Unwind`` too) raised here."""
    import asyncio

    inbox = _INBOX.get()
    if inbox is None:
        raise RuntimeError("a ctx call of an async workflow was awaited outside its workflow")
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        try:
            result = value()
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, answer, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, answer, result, None)

    inbox.hand(work)
    return await answer


def _settle(answer: asyncio.Future[Any], result: Any, failure: BaseException | None) -> None:
    if answer.done():
        return  # the awaiting task was cancelled
    if failure is not None:
        answer.set_exception(failure)
    else:
        answer.set_result(result)


# -- durabl's private event loop -----------------------------------------------------------


class _LoopThread:
    """An event loop running in a daemon thread of its own until ``stop``; ``asyncio.run``
    then cancels what is left on it, closes its async generators and the loop."""

    loop: asyncio.AbstractEventLoop
    _stopped: asyncio.Future[None]

    def __init__(self) -> None:
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="durabl-loop", daemon=True)
        self.thread.start()
        self._started.wait()

    def _serve(self) -> None:
        import asyncio

        asyncio.run(self._until_stopped())

    async def _until_stopped(self) -> None:
        import asyncio

        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()
        self._started.set()
        await self._stopped

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(_settle, self._stopped, None, None)
        if threading.current_thread() is not self.thread:
            self.thread.join()


class _PrivateLoop:
    """durabl's one private event loop, for the awaitables of the sync API: started when first
    taken, stopped when the last holder lets go. The holders (runtimes, and the adapters of
    async workflows driven through the sync API) are held weakly: one collected without
    letting go holds nothing, and the daemon thread ends with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: weakref.WeakSet[object] = weakref.WeakSet()
        self._running: _LoopThread | None = None

    def take(self, holder: object) -> asyncio.AbstractEventLoop:
        with self._lock:
            self._holders.add(holder)
            if self._running is None:
                self._running = _LoopThread()
            return self._running.loop

    def let_go(self, holder: object) -> None:
        with self._lock:
            if holder not in self._holders:
                return
            self._holders.discard(holder)
            if len(self._holders) or self._running is None:
                return
            ending, self._running = self._running, None
        ending.stop()

    def forget(self) -> None:
        """In a forked child: the parent's loop thread was not copied, so nothing is running."""
        self._lock = threading.Lock()
        self._holders = weakref.WeakSet()
        self._running = None


_PRIVATE = _PrivateLoop()
os.register_at_fork(after_in_child=_PRIVATE.forget)

_NEVER_AWAITABLE = frozenset({dict, list, str, int, float, bool, type(None)})
"""The types most tools and models return, none of them awaitable: told apart by ``type(...) in``
before the ABC check of ``inspect.isawaitable``, on every step's result."""


# -- async workflows -------------------------------------------------------------------------


class AsyncContext:
    """``ctx`` in an async workflow: the run's ``Context``, with the calls that record a value
    awaited (``await ctx.now()``, ``random()``, ``uuid()``, ``patched(...)``), so that the write
    is made by the thread driving the run while the loop goes on; served from the log on replay,
    as in a sync workflow."""

    __slots__ = ("_ctx", "input", "run_id", "workflow")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.run_id = ctx.run_id
        self.workflow = ctx.workflow
        self.input = ctx.input

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is being fed recorded results (no step has run for real yet)."""
        return self._ctx.is_replaying

    async def now(self) -> float:
        """Epoch seconds from the runtime's clock, recorded on first call."""
        return await _in_drive(self._ctx.now)

    async def random(self) -> float:
        """A float in [0, 1), recorded on first call."""
        return await _in_drive(self._ctx.random)

    async def uuid(self) -> str:
        """A random UUID4 string, recorded on first call."""
        return await _in_drive(self._ctx.uuid)

    async def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new branch of the change ``patch_id``
        (``durabl.context.Context.patched``)."""
        return await _in_drive(lambda: self._ctx.patched(patch_id))

    def log(self, message: str) -> None:
        """Log a line from the workflow; silent while replaying."""
        self._ctx.log(message)


class AsyncSteps(Generator[Any, Any, Any]):
    """An async workflow as the drive's send/throw loop sees it: a generator of steps.

    ``send``/``throw`` advance the async generator (``asend``/``athrow``) as a task on the loop
    of this pass (the caller's, or the private one, held for the pass) and return the step it
    yields; ``yield Return(value)`` ends it like a ``return``. Every task of the pass runs in
    one context. ``close`` closes the async generator (its ``finally`` blocks run, as a sync
    workflow's do when the drive drops it) and lets go of the loop."""

    def __init__(
        self,
        fn: Callable[..., Any],
        ctx: Context,
        kwargs: dict[str, Any],
    ) -> None:
        loop = caller_loop()
        self._holds = loop is None
        self._loop = loop if loop is not None else _PRIVATE.take(self)
        if _running_loop() is self._loop:
            self._let_go()
            raise RuntimeError(
                "an async workflow was driven through the sync API from a coroutine on "
                "durabl's own event loop: call the async API (await rt.arun(...)) instead"
            )
        self._context = contextvars.copy_context()
        self._agen = fn(AsyncContext(ctx), **kwargs)
        self._closed = False

    def send(self, value: Any) -> Any:
        return self._advance(self._agen.asend(value))

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if not isinstance(typ, BaseException):  # the old (type, value) form
            typ = val if isinstance(val, BaseException) else typ()
        return self._advance(self._agen.athrow(typ))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wait(self._agen.aclose())
        except Exception as exc:  # a body that yields in its finally: the pass is over anyway
            import logging  # only here: rare

            logging.getLogger("durabl").warning("closing an async workflow failed: %s", exc)
        finally:
            self._let_go()

    def _advance(self, advancing: Awaitable[Any]) -> Any:
        try:
            yielded = self._wait(advancing)
        except StopAsyncIteration:
            raise StopIteration(None) from None
        if isinstance(yielded, Return):
            self._closed = True
            try:
                self._wait(self._agen.aclose())  # the body's finally blocks, as at a return
            finally:
                self._let_go()
            raise StopIteration(yielded.value)
        return yielded

    def _wait(self, awaitable: Awaitable[Any]) -> Any:
        return _wait_on(self._loop, awaitable, self._context, _Inbox())

    def _let_go(self) -> None:
        if self._holds:
            self._holds = False
            _PRIVATE.let_go(self)


# -- the async API ---------------------------------------------------------------------------


class SyncAPI(Protocol[Stats]):
    """What ``AsyncRuntime`` asks of the class it is mixed into: the sync methods it runs in a
    thread (``Runtime``'s). ``Stats`` is what ``serve`` returns (``durabl.worker.WorkerStats``,
    which this module may not import: the drive, a layer below the worker, imports this module
    through ``durabl.workflow``)."""

    @property
    def start(self) -> Callable[..., str]: ...
    @property
    def run(self) -> Callable[..., RunState]: ...
    @property
    def resume(self) -> Callable[[str], RunState]: ...
    @property
    def resume_all(self) -> Callable[[], list[RunState]]: ...
    @property
    def tick(self) -> Callable[[float | None], list[RunState]]: ...
    @property
    def signal(self) -> Callable[[str, str, Any], int]: ...
    @property
    def serve(self) -> Callable[..., Stats]: ...
    @property
    def stop(self) -> Callable[[], None]: ...


class AsyncRuntime:
    """The async API of ``Runtime``, which inherits it. Each method runs the sync method of the
    same name in a thread (``asyncio.to_thread``) and returns what it returns; the async tool
    and model calls of the runs it drives run on the caller's loop. A cancelled ``await`` does
    not stop the drive in its thread (a step cannot be stopped half way): ``stop()`` parks."""

    async def astart(self: SyncAPI[Any], workflow: Any, input: Any = None, **options: Any) -> str:
        """``start``: create a run and drive it as far as it goes; returns its id."""
        return await _in_thread(self.start, workflow, input, **options)

    async def arun(
        self: SyncAPI[Any], workflow: Any, input: Any = None, **options: Any
    ) -> RunState:
        """``run``: ``astart``, and return the state the run reached."""
        return await _in_thread(self.run, workflow, input, **options)

    async def aresume(self: SyncAPI[Any], run_id: str) -> RunState:
        """``resume``: drive an existing run on from where its log ends."""
        return await _in_thread(self.resume, run_id)

    async def aresume_all(self: SyncAPI[Any]) -> list[RunState]:
        """``resume_all``: resume every interrupted or held run."""
        return await _in_thread(self.resume_all)

    async def atick(self: SyncAPI[Any], now: float | None = None) -> list[RunState]:
        """``tick``: fire every timer due at ``now`` and drive those runs on."""
        return await _in_thread(self.tick, now)

    async def asignal(self: SyncAPI[Any], run_id: str, name: str, payload: Any = None) -> int:
        """``signal``: send ``payload`` to the run's ``WaitSignal(name)`` (a durable write, made
        in a thread)."""
        return await _in_thread(self.signal, run_id, name, payload)

    async def aserve(
        self: SyncAPI[Stats], *, concurrency: int = 1, poll_s: float | None = None
    ) -> Stats:
        """``serve``: a worker driving up to ``concurrency`` runs at once, in as many threads,
        their async tool and model calls all on this loop, until ``stop()``, which a cancelled
        ``aserve`` (Ctrl-C in ``asyncio.run``) calls too. ``poll_s`` defaults to
        ``durabl.worker.POLL_S``."""
        import asyncio

        options = {} if poll_s is None else {"poll_s": poll_s}
        try:
            return await _in_thread(self.serve, concurrency=concurrency, **options)
        except asyncio.CancelledError:
            self.stop()  # else the worker would go on in its thread, serving a loop that is gone
            raise

    def _awaited(self, value: Any, streamed_to: Any = None) -> Any:
        """``value``; or, if it is awaitable, what it gives once run to completion on the loop
        of this call (the caller's, else the private one, held until ``close``).
        ``streamed_to``: the model call an async client answers (a ``ModelCallContext``, which
        this module does not import: see ``SyncAPI``), whose streamed text is then recorded by
        this thread, not on the loop: its ``record_partial`` is swapped for the call."""
        if type(value) in _NEVER_AWAITABLE or not inspect.isawaitable(value):
            return value
        loop = caller_loop()
        if loop is None:
            loop = _PRIVATE.take(self)
        inbox = _Inbox()
        if streamed_to is None:
            return _wait_on(loop, value, contextvars.copy_context(), inbox)
        record = streamed_to.record_partial
        streamed_to.record_partial = inbox.later(record)
        try:
            return _wait_on(loop, value, contextvars.copy_context(), inbox)
        finally:
            streamed_to.record_partial = record

    def _let_go_of_loop(self) -> None:
        """Let go of durabl's private loop, if this runtime took it (``close``): the last to
        let go stops it."""
        _PRIVATE.let_go(self)


async def _in_thread(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` in a thread, noting the running loop for it (``_CALLER``)."""
    import asyncio

    loop = asyncio.get_running_loop()
    return await asyncio.to_thread(_for_caller, loop, call, args, kwargs)


def _for_caller(
    loop: asyncio.AbstractEventLoop,
    call: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    _CALLER.set(loop)  # in to_thread's copy of the caller's context: for this call only
    return call(*args, **kwargs)


__all__ = ["AsyncContext", "AsyncRuntime", "AsyncSteps", "Return", "SyncAPI", "caller_loop"]
