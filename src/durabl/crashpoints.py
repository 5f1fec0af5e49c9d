"""Named crash points: the instants where the chaos harness kills the runtime.

In production the hook list is empty and ``reach`` costs one truth test of it. A hook raises
``ProcessDeath`` (a ``BaseException`` the runtime never catches, so the transaction helper rolls
back and nothing above it can swallow the death) or SIGKILLs its own process.

Each constant's docstring says what is, and is not, durable at that instant.
"""

from __future__ import annotations

from collections.abc import Callable

AFTER_LEASE_TAKEN = "after_lease_taken"
"""This process took the run's lease over (the token grew); nothing of the run is written yet.
The next process finds a lease whose owner is gone and takes it again."""
AFTER_RUN_STARTED = "after_run_started"
"""The run row and RUN_STARTED are durable; no step has been recorded."""
BEFORE_STEP_STARTED = "before_step_started"
"""The workflow yielded a step the log has not seen; nothing of it is recorded."""
AFTER_STEP_STARTED = "after_step_started"
"""The attempt has begun and control has not left durabl, so the tool or model did not run. A
model call's STEP_STARTED is committed; a tool's is committed with its TOOL_DISPATCHED."""
AFTER_TOOL_DISPATCHED = "after_tool_dispatched"
"""The tool is about to be called. For an AT_MOST_ONCE tool or an explicit key, STEP_STARTED and
TOOL_DISPATCHED are committed, and from here until the completion commits a crash is ambiguous;
an IDEMPOTENT tool with a derived key commits them with its outcome, so a crash leaves nothing."""
AFTER_TOOL_RETURNED = "after_tool_returned"
"""The tool returned (or raised); its outcome is not recorded. The ambiguous window."""
AFTER_MODEL_RETURNED = "after_model_returned"
"""The model answered; the answer is not recorded, so it will be asked again (tokens re-spent)."""
AFTER_STEP_COMMITTED = "after_step_committed"
"""The side_effects row and STEP_COMPLETED are committed together: replay serves this step."""
AFTER_RETRY_SCHEDULED = "after_retry_scheduled"
"""A failed attempt and its backoff timer are committed; the next attempt has not begun."""
BEFORE_CTX_RECORDED = "before_ctx_recorded"
"""A ctx.now()/random()/uuid() value was drawn but not recorded; a restart draws a new one."""
AFTER_TIMER_ARMED = "after_timer_armed"
"""The Sleep's deadline is committed; the timer has not fired."""
BEFORE_TIMER_FIRED = "before_timer_fired"
"""The timer is due and still armed; TIMER_FIRED is not recorded."""
AFTER_TIMER_FIRED = "after_timer_fired"
"""TIMER_FIRED and the disarm are committed together."""
DURING_REPLAY = "during_replay"
"""A step was just served from the log; replay writes nothing, so nothing changed."""
BEFORE_RUN_COMPLETED = "before_run_completed"
"""The workflow returned; RUN_COMPLETED is not recorded, so the run replays to here again."""
AFTER_DEAD_LETTERED = "after_dead_lettered"
"""DEAD_LETTERED and the run's status are committed together."""

ALL = (
    AFTER_LEASE_TAKEN,
    AFTER_RUN_STARTED,
    BEFORE_STEP_STARTED,
    AFTER_STEP_STARTED,
    AFTER_TOOL_DISPATCHED,
    AFTER_TOOL_RETURNED,
    AFTER_MODEL_RETURNED,
    AFTER_STEP_COMMITTED,
    AFTER_RETRY_SCHEDULED,
    BEFORE_CTX_RECORDED,
    AFTER_TIMER_ARMED,
    BEFORE_TIMER_FIRED,
    AFTER_TIMER_FIRED,
    DURING_REPLAY,
    BEFORE_RUN_COMPLETED,
    AFTER_DEAD_LETTERED,
)

hooks: list[Callable[[str], None]] = []
"""The installed hooks, empty in production. ``reach`` tests it first; a path that passes
several points at once, once for each of a run's steps, tests it itself (one truth test
instead of a call per point)."""
_declared: set[str] = set(ALL)


def declare(point: str) -> str:
    """Register a crash point that lives outside the runtime (a test's broken runtime declares
    the gap its bug opens). The real runtime's points are exactly ``ALL``."""
    _declared.add(point)
    return point


class ProcessDeath(BaseException):
    """A simulated process death at a named crash point. Nothing in durabl catches it."""

    def __init__(self, point: str) -> None:
        super().__init__(f"process died at crash point {point!r}")
        self.point = point


def reach(point: str) -> None:
    """Called by the runtime at each named point. Free when no hook is installed."""
    if hooks:
        for hook in list(hooks):
            hook(point)


def install(hook: Callable[[str], None]) -> Callable[[], None]:
    """Install a hook; returns a function that removes it."""
    hooks.append(hook)
    return lambda: hooks.remove(hook) if hook in hooks else None


class CrashAt:
    """A hook that raises ``ProcessDeath`` the ``occurrence``-th time ``point`` is reached."""

    def __init__(self, point: str, occurrence: int = 1) -> None:
        if point not in _declared:
            raise ValueError(
                f"unknown crash point {point!r}; known: {', '.join(sorted(_declared))}"
            )
        self.point = point
        self.occurrence = occurrence
        self.seen = 0
        self.fired = False

    def __call__(self, point: str) -> None:
        if point == self.point and not self.fired:
            self.seen += 1
            if self.seen == self.occurrence:
                self.fired = True
                raise ProcessDeath(point)

    def __enter__(self) -> CrashAt:
        self._remove = install(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()
