"""A tool that must not run twice: a card charge killed inside its ambiguous window.

The checkout agent asks a (stub) model to approve an order, charges the card, then emails a
receipt. ``charge_card`` appends a line to a ledger file and is registered AT_MOST_ONCE: a card
network that ignores idempotency keys would take the money again if the call were repeated.

    python examples/at_most_once.py              # files in a fresh temporary folder
    python examples/at_most_once.py --dir DIR    # ledger, outbox and database in DIR

What happens, stage by stage:

1. The script runs the agent in a child process (itself, with ``--child``). The charge tool
   writes the ledger line, drops a marker file and then waits, as if for the network's answer.
   The parent sees the marker and kills the child with SIGKILL: the charge happened, but durabl
   never recorded its result. That is the ambiguous window.
2. The parent runs the agent again. durabl finds the charge dispatched with no outcome and,
   because the tool is AT_MOST_ONCE, does not call it again: it dead-letters the run. The
   dead letter is shown through ``rt.dead_letters()`` and through ``durabl dlq``.
3. The operator (here, the script) looks in the ledger, finds exactly one charge under the
   step's idempotency key, and resolves the dead letter with that charge as the step's result
   (``rt.resolve``; ``durabl dlq resolve RUN --result JSON`` does the same from a shell, given
   ``--import`` of a module that registers the workflow and defines ``DURABL_TOOLS``).
4. The run completes: the receipt goes out, and the ledger still holds one charge.

Exit status 0 when the ledger holds exactly one charge and one receipt was sent, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durabl import ModelCall, Runtime, ToolCall, ToolMode, events, tool, workflow

RUN_ID = "checkout-1042"
ORDER = {"order_id": "1042", "amount_cents": 4999, "card": "tok_visa_4242"}
CHARGE_KEY = f"charge-{ORDER['order_id']}"
"""The charge's explicit idempotency key: the name the ledger and the dead letter share."""

MARKER = "charged.marker"
"""Written by the child right after the charge: the parent kills it once this exists."""


# -- the workflow ----------------------------------------------------------------------------


@workflow(name="checkout")
def checkout(ctx: Any, order_id: str, amount_cents: int, card: str) -> Any:
    verdict = yield ModelCall(f"Approve order {order_id} for {amount_cents} cents?")
    if not verdict["approve"]:
        return {"order_id": order_id, "status": "declined"}
    charge = yield ToolCall(
        "charge_card",
        {"order_id": order_id, "amount_cents": amount_cents, "card": card},
        idempotency_key=f"charge-{order_id}",
    )
    receipt = yield ToolCall(
        "email_receipt", {"order_id": order_id, "charge_id": charge["charge_id"]}
    )
    return {"order_id": order_id, "charge": charge, "receipt": receipt}


# -- the outside world: a stub model, a ledger and an outbox ---------------------------------


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """A deterministic stand-in for an LLM: it approves every order."""
    return {"approve": True, "reason": f"looks fine: {prompt}"}


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync it, so the effect survives the SIGKILL that follows."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def make_tools(folder: Path, *, hang_after_charge: bool) -> dict[str, Any]:
    """The two tools. ``charge_card`` does not dedupe on its key (that is why it is
    AT_MOST_ONCE); with ``hang_after_charge`` it announces the charge and then hangs, so the
    parent can kill the process inside the ambiguous window."""
    ledger, outbox = folder / "ledger.jsonl", folder / "outbox.jsonl"

    def charge_card(
        order_id: str, amount_cents: int, card: str, *, idempotency_key: str
    ) -> dict[str, Any]:
        charge_id = "ch_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]
        record = {"charge_id": charge_id, "key": idempotency_key, "amount_cents": amount_cents}
        append_line(ledger, {**record, "order_id": order_id, "card": card, "pid": os.getpid()})
        print(f"    charge_card: charged {amount_cents} cents, ledger line written", flush=True)
        if hang_after_charge:
            (folder / MARKER).write_text(str(os.getpid()))
            time.sleep(60)  # waiting for the card network's answer; killed here
        return record

    def email_receipt(order_id: str, charge_id: str, *, idempotency_key: str) -> dict[str, Any]:
        if not any(line["key"] == idempotency_key for line in read_lines(outbox)):
            append_line(outbox, {"key": idempotency_key, "order_id": order_id, "charge": charge_id})
        print(f"    email_receipt: receipt for {charge_id} in the outbox", flush=True)
        return {"sent": True, "charge_id": charge_id}

    return {
        "charge_card": tool(charge_card, mode=ToolMode.AT_MOST_ONCE),
        "email_receipt": tool(email_receipt, mode=ToolMode.IDEMPOTENT),
    }


# -- the stages ------------------------------------------------------------------------------


def child(folder: Path) -> int:
    """Stage 1's victim: run the agent until the charge tool hangs (the parent kills it)."""
    tools = make_tools(folder, hang_after_charge=True)
    with Runtime(folder / "checkout.db", llm=stub_model, tools=tools) as rt:
        rt.run(checkout, ORDER, run_id=RUN_ID)
    return 0


def kill_inside_charge(folder: Path) -> int:
    """Start the child, wait for its marker, SIGKILL it; returns the child's pid."""
    marker = folder / MARKER
    argv = [sys.executable, str(Path(__file__).resolve()), "--dir", str(folder), "--child"]
    proc = subprocess.Popen(argv)
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the child exited ({proc.returncode}) before charging the card")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the child never reached the charge")
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.pid


def dlq_listing(db: Path) -> str:
    """What ``durabl dlq`` prints for the database (the command opens it read-only)."""
    argv = [sys.executable, "-m", "durabl", "--db", str(db), "dlq"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.rstrip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="durabl-at-most-once-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(folder)
    db, ledger, outbox = folder / "checkout.db", folder / "ledger.jsonl", folder / "outbox.jsonl"
    for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), ledger, outbox, folder / MARKER):
        stale.unlink(missing_ok=True)
    print(f"files in {folder}")

    print("\n[1] the agent runs in a child process and is killed inside charge_card")
    pid = kill_inside_charge(folder)
    print(f"    child pid {pid} killed with SIGKILL after the charge, before durabl recorded it")
    print(f"    ledger: {len(read_lines(ledger))} charge(s)")

    tools = make_tools(folder, hang_after_charge=False)
    with Runtime(db, llm=stub_model, tools=tools) as rt:
        left = rt.state(RUN_ID).status
        print(f"\n[2] run again; the log shows the run {left}: its process died mid-step")
        state = rt.run(checkout, ORDER, run_id=RUN_ID)
        print(f"    rt.run() -> {state.status}: durabl did not call charge_card again")
        for letter in rt.dead_letters():
            print(
                f"    dead letter: run {letter.run_id} step {letter.step} {letter.step_description}"
            )
            print(f"      reason: {letter.reason}")
            print(f"      idempotency key: {letter.idempotency_key}")
        print("    `durabl dlq` says:")
        print("      " + dlq_listing(db).replace("\n", "\n      "))
        if state.status != events.DEAD_LETTERED:
            print("FAILED: the run was not dead-lettered")
            return 1

        print("\n[3] the operator checks the ledger for the step's key")
        charges = [line for line in read_lines(ledger) if line["key"] == CHARGE_KEY]
        print(f"    ledger lines with key {CHARGE_KEY!r}: {len(charges)}")
        if len(charges) != 1:
            print("FAILED: expected exactly one charge under the key")
            return 1
        found = charges[0]
        result = {key: found[key] for key in ("charge_id", "key", "amount_cents")}
        print(f"    the charge happened once; resolving with {json.dumps(result, sort_keys=True)}")
        state = rt.resolve(RUN_ID, result)
        print(f"    rt.resolve() -> {state.status}")

        print("\n[4] the outcome")
        metrics = rt.metrics(RUN_ID)
        print(f"    result: {json.dumps(rt.result(RUN_ID), sort_keys=True)}")
        print(
            f"    metrics: tool_calls={metrics.tool_calls} attempts={metrics.attempts} "
            f"dead_letters={metrics.dead_letters} resumes={metrics.resumes}"
        )
    charges, receipts = read_lines(ledger), read_lines(outbox)
    print(f"    ledger: {len(charges)} charge(s); outbox: {len(receipts)} receipt(s)")
    ok = state.status == events.COMPLETED and len(charges) == 1 and len(receipts) == 1
    print("OK: charged exactly once" if ok else "FAILED: the ledger or the outbox is wrong")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
