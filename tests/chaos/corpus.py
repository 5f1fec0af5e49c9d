"""The chaos grid's corpus: workflows, and an outside world that survives any process death.

Every workflow is an ordinary durabl workflow. Between them they cover model calls (one that
fails its first call and is retried with backoff), IDEMPOTENT and AT_MOST_ONCE tools, explicit
and derived idempotency keys, a key asked for twice in one run and keys shared by two runs, Sleep
timers (one of zero length), ctx.now/random/uuid, a tool retried with backoff after failing its
first attempt, ToolFailed caught by the workflow (from an IDEMPOTENT tool that exhausts its
retries and from an AT_MOST_ONCE tool that raises), a long run of more than forty steps,
``ctx.patched`` markers recorded before, between and after other steps, ``WaitSignal``s
with and without a timeout: answered after the wait parked, answered before the run reached
it, and never answered (the signals a spec's ``answers`` say the driver sends), a ``Parallel``
of an AT_MOST_ONCE and an IDEMPOTENT tool and a model call that backs off (a dead-lettered
branch whose siblings settle before it), a ``ChildRun`` whose child dead-letters, backs off
and sleeps while its parent waits, and a chain of three runs by ``ContinueAsNew``, each with
its own charge and send, that hands a signal no wait took on to the next. Every one of these
three reaches every crash point. (The Parallel's branches run one at a time in the grid; its
twin with branches at once, ``AT_ONCE``, is killed by ``test_grid.py`` on its own.)
Compaction is not in the corpus: the grid's oracles read the whole log, which compaction folds
away. tests/oracles/test_compaction.py kills compactions at every line, and the state machine in
test_stateful.py compacts between random crashes.

The world lives in files under the scenario's folder, never in a Runtime or in the memory of the
process that dies: ``effects.jsonl`` is what the world has seen (the ledger the no-duplicate and
same-as-reference oracles read), ``attempts.jsonl`` remembers which flaky endpoints have already
failed once. A SIGKILLed child and the in-process harness therefore see the same world.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durabl import (
    TIMED_OUT,
    ChildRun,
    ContinueAsNew,
    ModelCall,
    Parallel,
    RetryPolicy,
    Sleep,
    ToolCall,
    ToolFailed,
    WaitSignal,
    tool,
)
from durabl.aio import Return
from oracles.support import Outbox

MODEL_RETRY = RetryPolicy(max_attempts=3, base_delay=2.0)
"""The runtime-wide policy: it is what retries the model call that fails its first attempt."""
FLAKY_RETRY = RetryPolicy(max_attempts=3, base_delay=5.0)
BROKEN_RETRY = RetryPolicy(max_attempts=2, base_delay=1.0)
AT_MOST_ONCE_TOOLS = frozenset({"charge", "decline"})
LONG_ROUNDS = 18
"""The long workflow's loop count: 18 rounds make a run of 44 step positions."""


class CardDeclined(Exception):
    """What the ``decline`` endpoint raises: it fails before any effect happens."""


class World:
    """The model and the tools, with state only in files under ``root``.

    - ``send`` (IDEMPOTENT): delivers a message; honours the client key it is handed, like an
      API that deduplicates on it, so a repeated call has no second effect.
    - ``charge`` (AT_MOST_ONCE): takes money on every call; it cannot deduplicate. Its ledger
      record carries the result, which is what an operator resolving a dead letter supplies.
    - ``decline`` (AT_MOST_ONCE): always refuses, before anything happens.
    - ``search`` (IDEMPOTENT): a pure lookup, no effect.
    - ``flaky`` (IDEMPOTENT, 3 attempts, 5 s backoff): fails the first call for each key.
    - ``broken`` (IDEMPOTENT, 2 attempts, 1 s backoff): always raises.
    - the model answers deterministically; a prompt starting ``flaky:`` fails its first call.
    """

    def __init__(self, root: Path) -> None:
        self.effects = Outbox(root / "effects.jsonl")
        self.attempts = Outbox(root / "attempts.jsonl")
        self.calls = 0
        """Calls made through this instance (in memory: only the replay check reads it)."""

    def _first_attempt(self, what: str) -> bool:
        """True the first time ``what`` is asked for, in any process: it is then written down."""
        if self.attempts.find(what) is not None:
            return False
        self.attempts.append({"key": what})
        return True

    # -- the model -------------------------------------------------------------------------

    def llm(self, prompt: Any, **params: Any) -> dict[str, Any]:
        self.calls += 1
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
        if text.startswith("flaky:") and self._first_attempt(f"llm:{text}"):
            raise ConnectionError("model endpoint unavailable")
        return {"text": f"answer({text})", "tokens": len(text), "params": params}

    # -- the tools -------------------------------------------------------------------------

    def send(self, *, to: str, body: str, idempotency_key: str) -> dict[str, Any]:
        self.calls += 1
        if self.effects.find(idempotency_key) is None:
            self.effects.append({"tool": "send", "key": idempotency_key, "to": to, "body": body})
        return {"sent": f"{to}:{body}"}

    def charge(self, *, amount: int, memo: str, idempotency_key: str) -> dict[str, Any]:
        self.calls += 1
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
        result = {"charged": amount, "receipt": f"rcpt-{digest}"}
        self.effects.append(
            {"tool": "charge", "key": idempotency_key, "memo": memo, "result": result}
        )
        return result

    def decline(self, *, amount: int) -> None:
        self.calls += 1
        raise CardDeclined(f"card declined for {amount}")

    def search(self, *, q: str) -> list[str]:
        self.calls += 1
        return [f"{q}-1", f"{q}-2"]

    def flaky(self, *, n: int, idempotency_key: str) -> int:
        self.calls += 1
        if self._first_attempt(f"flaky:{idempotency_key}"):
            raise TimeoutError(f"flaky timed out for {idempotency_key}")
        return n * 10

    def broken(self, *, why: str) -> None:
        self.calls += 1
        raise ValueError(f"broken: {why}")

    def tools(self) -> dict[str, Any]:
        return {
            "send": tool(self.send, mode="IDEMPOTENT"),
            "charge": tool(self.charge, mode="AT_MOST_ONCE"),
            "decline": tool(self.decline, mode="AT_MOST_ONCE"),
            "search": tool(self.search, mode="IDEMPOTENT"),
            "flaky": tool(self.flaky, mode="IDEMPOTENT", retry=FLAKY_RETRY),
            "broken": tool(self.broken, mode="IDEMPOTENT", retry=BROKEN_RETRY),
        }

    def effect(self, key: str) -> dict[str, Any] | None:
        """What the world saw for an idempotency key: how an operator checks a dead letter."""
        return self.effects.find(key)


# -- the workflows ---------------------------------------------------------------------------


def research(ctx: Any, topic: str) -> Any:
    """Model calls, a keyless IDEMPOTENT lookup, an explicit-key send, a timer."""
    plan = yield ModelCall(f"plan {topic}")
    hits = []
    for q in (topic, plan["text"][:12]):
        hits.extend((yield ToolCall("search", {"q": q})))
    sent = yield ToolCall("send", {"to": "boss", "body": topic}, idempotency_key=f"report-{topic}")
    yield Sleep(seconds=30)
    summary = yield ModelCall({"summarise": hits}, temperature=0)
    return {"hits": sorted(hits), "sent": sent, "summary": summary["tokens"]}


def payment(ctx: Any, customer: str) -> Any:
    """Derived keys on both modes, then an explicit key on an AT_MOST_ONCE tool, asked for twice
    (the second time, durabl hands back the recorded effect without a call)."""
    invoice = yield ToolCall("send", {"to": customer, "body": "invoice"})
    first = yield ToolCall("charge", {"amount": 10, "memo": "first"})
    second_key = f"second-{ctx.run_id}"
    second = yield ToolCall("charge", {"amount": 20, "memo": "second"}, idempotency_key=second_key)
    again = yield ToolCall("charge", {"amount": 20, "memo": "second"}, idempotency_key=second_key)
    return [invoice, first, second, again == second]


def clocked(ctx: Any, label: str) -> Any:
    """ctx values, a zero-length timer (due as it is armed), two more timers, and a message whose
    body carries a recorded uuid."""
    started_s = ctx.now()
    luck = ctx.random()
    token = ctx.uuid()
    yield Sleep(seconds=0)
    yield Sleep(seconds=60)
    woke_s = ctx.now()
    sent = yield ToolCall("send", {"to": label, "body": f"token {token}"})
    yield Sleep(hours=1)
    woke_again_s = ctx.now()
    return {
        "started_s": started_s,
        "luck": luck,
        "token": token,
        "slept": [woke_s - started_s >= 60, woke_again_s - woke_s >= 3600],
        "sane": 0 <= luck < 1 and len(token) == 36,
        "sent": sent,
    }


def retrying(ctx: Any, topic: str) -> Any:
    """Retries with backoff (model and tool), ToolFailed caught from both tool modes."""
    plan = yield ModelCall(f"flaky: plan retries for {topic}")
    value = yield ToolCall("flaky", {"n": plan["tokens"]})
    try:
        yield ToolCall("broken", {"why": topic})
        fallback = "none"
    except ToolFailed as failed:
        fallback = failed.error_type
    try:
        yield ToolCall("decline", {"amount": 99})
        declined = "none"
    except ToolFailed as failed:
        declined = failed.error_type
    sent = yield ToolCall("send", {"to": "retry", "body": f"{value}/{fallback}/{declined}"})
    return [value, fallback, declined, sent]


def shared(ctx: Any, order: int, lag_s: int) -> Any:
    """Two runs hold the same explicit keys: one charge and one notice for one order."""
    note = yield ModelCall(f"note for order {order}")
    yield Sleep(seconds=10 + lag_s)
    paid = yield ToolCall(
        "charge", {"amount": order, "memo": f"order {order}"}, idempotency_key=f"order-{order}"
    )
    told = yield ToolCall(
        "send",
        {"to": "billing", "body": f"order {order} paid"},
        idempotency_key=f"order-{order}-notice",
    )
    return {"note": note["text"], "paid": paid, "told": told}


def long(ctx: Any, rounds: int) -> Any:
    """A long run: 44 step positions, two timers, explicit keys along the way, a final charge."""
    notes = []
    for i in range(rounds):
        hits = yield ToolCall("search", {"q": f"topic-{i}"})
        note = yield ModelCall(f"note {i}: {hits[0]}")
        notes.append(note["tokens"])
        if i % 4 == 3:
            yield ToolCall(
                "send", {"to": "digest", "body": note["text"]}, idempotency_key=f"digest-{i}"
            )
        if i in (6, 12):
            yield Sleep(minutes=5)
    stamp = ctx.uuid()
    paid = yield ToolCall("charge", {"amount": sum(notes), "memo": "long"})
    return {"notes": notes, "stamp": stamp, "paid": paid}


def mixed(ctx: Any, topic: str) -> Any:
    """A model call, a timer, an explicit-key charge, a uuid, a derived-key send."""
    idea = yield ModelCall(f"idea for {topic}")
    yield Sleep(seconds=10)
    paid = yield ToolCall(
        "charge", {"amount": idea["tokens"], "memo": topic}, idempotency_key=f"pay-{topic}"
    )
    tag = ctx.uuid()
    sent = yield ToolCall("send", {"to": "mixed", "body": idea["text"]})
    return {"paid": paid, "sent": sent, "tag": tag}


async def mixed_async(ctx: Any, topic: str) -> Any:
    """``mixed`` as an async workflow (``async def``, driven through ``durabl.aio``): a model
    call, a timer, an explicit-key charge, an awaited uuid, a derived-key send, an awaited
    coroutine between steps (not recorded), and ``yield Return``."""
    idea = yield ModelCall(f"idea for {topic}")
    yield Sleep(seconds=10)
    paid = yield ToolCall(
        "charge", {"amount": idea["tokens"], "memo": topic}, idempotency_key=f"pay-{topic}"
    )
    await asyncio.sleep(0)
    tag = await ctx.uuid()
    sent = yield ToolCall("send", {"to": "mixed", "body": idea["text"]})
    yield Return({"paid": paid, "sent": sent, "tag": tag})


def patched(ctx: Any, topic: str) -> Any:
    """``ctx.patched`` around other steps: a marker as the run's first record, before a model
    call; one between a timer and an AT_MOST_ONCE charge; one between a ctx value and the end of
    the run, its branch holding no step. Every run here meets each change for the first time, so
    each marker is recorded and replayed True, and the old branches are never taken."""
    if ctx.patched("chaos-plan-v2"):
        plan = yield ModelCall(f"plan v2 for {topic}")
    else:
        plan = yield ModelCall(f"plan for {topic}")
    yield Sleep(seconds=20)
    if ctx.patched("chaos-pay-v2"):
        paid = yield ToolCall("charge", {"amount": plan["tokens"], "memo": topic})
    else:
        paid = yield ToolCall("charge", {"amount": 1, "memo": topic})
    sent = yield ToolCall(
        "send", {"to": "patched", "body": plan["text"]}, idempotency_key=f"patched-{topic}"
    )
    stamp = ctx.uuid()
    closing = "v2" if ctx.patched("chaos-close-v2") else "v1"
    return {"paid": paid, "sent": sent, "stamp": stamp, "closing": closing}


def fanned(ctx: Any, topic: str) -> Any:
    """A ``Parallel`` of an AT_MOST_ONCE charge (first, derived key), an IDEMPOTENT send with an
    explicit key (its claim taken at dispatch) and a model call that fails its first attempt
    (the branch backs off, parking the run), between a model call and a timer, a uuid and a
    send. Its branches run one at a time (``max_concurrency=1``): the grid numbers the
    occurrences of each point, which must name the same instant in every process and in both
    death modes (``fanned_at_once``, the same with its branches at once, is killed by
    ``test_grid.py`` on its own). After a death in the charge's window the charge is
    dead-lettered and its siblings settle all the same, so the branches end out of the order
    given, the redriven (or resolved) charge last."""
    return (yield from _fan(ctx, topic, 1))


def fanned_at_once(ctx: Any, topic: str) -> Any:
    """``fanned`` with its three branches running at once."""
    return (yield from _fan(ctx, topic, None))


def _fan(ctx: Any, topic: str, concurrency: int | None) -> Any:
    plan = yield ModelCall(f"fan out {topic}")
    paid, sent, opinion = yield Parallel(
        [
            ToolCall("charge", {"amount": plan["tokens"], "memo": f"fan {topic}"}),
            ToolCall("send", {"to": "fan", "body": plan["text"]}, idempotency_key=f"fan-{topic}"),
            ModelCall(f"flaky: second opinion on {topic}"),
        ],
        max_concurrency=concurrency,
    )
    yield Sleep(seconds=15)
    stamp = ctx.uuid()
    told = yield ToolCall("send", {"to": "fanned", "body": f"{opinion['text']} {stamp}"})
    return {"paid": paid, "sent": sent, "opinion": opinion["tokens"], "told": told}


SHIPPING = "chaos.shipping"


def shipping(ctx: Any, order: int, note: str) -> Any:
    """The child of ``chaos.child``: an AT_MOST_ONCE charge (derived key, so its dead letter is
    the child's, its parent waiting; the first tool its run dispatches, so that the sample's
    first deaths fall in its window), a lookup, a tool that fails its first attempt (the child
    backs off), a timer (the child sleeps), a uuid, an explicit-key send."""
    fee = yield ToolCall("charge", {"amount": order, "memo": "postage"})
    label = yield ToolCall("search", {"q": f"label {order}"})
    weight = yield ToolCall("flaky", {"n": order})
    yield Sleep(seconds=30)
    packed = ctx.uuid()
    sent = yield ToolCall(
        "send", {"to": "warehouse", "body": f"{note} {packed}"}, idempotency_key=f"ship-{order}"
    )
    return {"label": label[0], "fee": fee, "weight": weight, "sent": sent}


def parent(ctx: Any, order: int) -> Any:
    """A model call, a ``ChildRun`` of ``chaos.shipping`` (its id derived from this run's and
    the step's), and an explicit-key send of what the child returned."""
    note = yield ModelCall(f"brief for order {order}")
    shipped = yield ChildRun(SHIPPING, {"order": order, "note": note["text"]})
    told = yield ToolCall(
        "send", {"to": "customer", "body": shipped["label"]}, idempotency_key=f"shipped-{order}"
    )
    return {"shipped": shipped, "told": told}


SHIPPING = "chaos.shipping"


TURNS = 3


def turns(
    ctx: Any, topic: str, turn: int = 1, receipts: tuple[str, ...] = (), note: str = ""
) -> Any:
    """A bounded loop of ``TURNS`` turns by ``ContinueAsNew``: each turn is a run of its own
    that takes an AT_MOST_ONCE charge (explicit key) and sends with a derived key (the new
    run's id in it), carrying the receipts on in its input. The first turn waits for ``go``;
    the driver sends ``next`` with it, which no wait of that run takes: the ContinueAsNew hands
    it to the second turn, whose wait takes it at once, and whose model call fails its first
    attempt; the third sleeps and reads the clock. The last turn returns it all."""
    if turn == 1:
        note = (yield WaitSignal("go"))["by"]
    elif turn == 2:
        heard = (yield WaitSignal("next"))["by"]
        idea = yield ModelCall(f"flaky: an idea for {topic} from {heard}")
        note = f"{note}, then {heard} ({idea['tokens']})"
    else:
        yield Sleep(seconds=20)
        note = f"{note}, at {ctx.now()}"
    paid = yield ToolCall(
        "charge", {"amount": 10 + turn, "memo": f"turn {turn}"}, idempotency_key=f"{topic}-{turn}"
    )
    sent = yield ToolCall("send", {"to": "turns", "body": f"{topic} turn {turn}: {note}"})
    receipts = (*receipts, paid["receipt"])
    if turn < TURNS:
        yield ContinueAsNew(
            {"topic": topic, "turn": turn + 1, "receipts": list(receipts), "note": note}
        )
    return {"receipts": list(receipts), "sent": sent, "turns": turn, "note": note}


APPROVE_WITHIN_S = 86400.0
"""Far longer than the driver ever takes to answer (its clock jumps an hour at most between two
looks, whatever deaths come between): the answered wait never times out."""
REPLY_WITHIN_S = 600.0
"""The wait nobody answers: the driver's jumps pass it within a few turns."""


def signalled(ctx: Any, topic: str) -> Any:
    """``WaitSignal`` between other steps: a wait with a timeout, parked and answered later;
    one without, whose signal was sent before the run reached it (taken at once); one with a
    timeout that nobody answers (``TIMED_OUT``, the fallback taken); and one without a timeout,
    parked and answered later. What the signals said flows into the steps after them."""
    draft = yield ModelCall(f"draft about {topic}")
    verdict = yield WaitSignal("approve", timeout=APPROVE_WITHIN_S)
    if verdict is TIMED_OUT:
        return "the approval timed out"  # never: the driver answers in time
    sent = yield ToolCall(
        "send",
        {"to": verdict["by"], "body": draft["text"]},
        idempotency_key=f"approved-{topic}",
    )
    budget = yield WaitSignal("budget")
    paid = yield ToolCall("charge", {"amount": budget["amount"], "memo": topic})
    reply = yield WaitSignal("reply", timeout=REPLY_WITHIN_S)
    chased = "nobody replied" if reply is TIMED_OUT else reply
    closing = yield WaitSignal("close")
    told = yield ToolCall("send", {"to": "closing", "body": f"{chased}; {closing}"})
    return {"sent": sent, "paid": paid, "chased": chased, "closing": closing, "told": told}


@dataclass(frozen=True)
class Answer:
    """A signal the driver sends, once: to ``run_id``, as soon as that run waits for the signal
    ``once_waiting_for`` (its own name, or an earlier wait's: then it is sent before the run
    reaches the wait it is for)."""

    run_id: str
    name: str
    payload: Any
    once_waiting_for: str
    """(``run_id`` names the first run of a ContinueAsNew chain: the answer goes to the run the
    chain has got to.)"""


@dataclass(frozen=True)
class Spec:
    """One workflow of the corpus, the runs a process boots with (started in this order), and
    the signals the driver sends them (looked at in this order)."""

    name: str
    fn: Callable[..., Any]
    runs: tuple[tuple[str, dict[str, Any]], ...]
    answers: tuple[Answer, ...] = ()


CORPUS: tuple[Spec, ...] = (
    Spec("chaos.research", research, (("research-1", {"topic": "otters"}),)),
    Spec("chaos.payment", payment, (("payment-1", {"customer": "acme"}),)),
    Spec("chaos.clocked", clocked, (("clocked-1", {"label": "alarm"}),)),
    Spec("chaos.retrying", retrying, (("retrying-1", {"topic": "otters"}),)),
    Spec(
        "chaos.shared",
        shared,
        (("shared-a", {"order": 42, "lag_s": 0}), ("shared-b", {"order": 42, "lag_s": 5})),
    ),
    Spec("chaos.long", long, (("long-1", {"rounds": LONG_ROUNDS}),)),
    Spec("chaos.mixed", mixed, (("mixed-1", {"topic": "kelp"}),)),
    Spec("chaos.mixed.async", mixed_async, (("mixed-async-1", {"topic": "eelgrass"}),)),
    Spec("chaos.patched", patched, (("patched-1", {"topic": "reefs"}),)),
    Spec(
        "chaos.signal",
        signalled,
        (("signal-1", {"topic": "kelp"}),),
        (
            Answer("signal-1", "budget", {"amount": 30}, once_waiting_for="approve"),
            Answer("signal-1", "approve", {"by": "ana"}, once_waiting_for="approve"),
            Answer("signal-1", "close", "closed by ana", once_waiting_for="close"),
        ),
    ),
    Spec("chaos.parallel", fanned, (("parallel-1", {"topic": "tides"}),)),
    Spec("chaos.child", parent, (("child-1", {"order": 7}),)),
    Spec(
        "chaos.continue",
        turns,
        (("continue-1", {"topic": "loop"}),),
        (
            Answer("continue-1", "next", {"by": "bo"}, once_waiting_for="go"),
            Answer("continue-1", "go", {"by": "ana"}, once_waiting_for="go"),
        ),
    ),
)
SPECS = {spec.name: spec for spec in CORPUS}
AT_ONCE = Spec("chaos.parallel.at_once", fanned_at_once, (("at-once-1", {"topic": "tides"}),))
"""``chaos.parallel`` with its branches at once: not in the grid (see ``fanned``)."""
WORKFLOWS = {
    **{spec.name: spec.fn for spec in CORPUS},
    SHIPPING: shipping,
    AT_ONCE.name: AT_ONCE.fn,
}
