"""LangGraph with its SQLite checkpointer, used as its durable-execution guide recommends.

The workload is a ``StateGraph`` with one node per step, chained START -> plan -> ... -> send ->
END, over a state holding one key per step's output. It is compiled with ``SqliteSaver`` on
``store/checkpoints.sqlite`` and always run on the same ``thread_id``. ``--durability`` passes
LangGraph's ``durability=`` to ``invoke``: ``sync`` (each step's checkpoint is saved before the
next step starts), ``async`` (LangGraph's default: saved on a background thread while the next
step runs) or ``exit`` (saved only when the graph exits).

Why nodes, not ``@task``: the guide asks for side effects and model calls to sit in a unit whose
result is persisted, so a resumed run does not repeat them; it offers ``@task`` for a node that
does several such operations. Here every node does exactly one, so the node is that unit already:
LangGraph saves a node's writes (``put_writes``) as soon as it returns and, on resume, restarts
from the beginning of the node that had not finished. A ``@task`` inside would persist the same
result at the same instant, one more write for nothing.

Restart: the guide's recovery is to invoke the same thread with ``None`` as input. So the adapter
reads the thread's latest checkpoint: none -> start a new invocation with the input; a checkpoint
whose step has tasks -> ``invoke(None)``; a checkpoint whose step has none -> the run already
finished, its final state is the result and nothing is run again. The test is on the snapshot's
``tasks``, not ``next``: ``next`` leaves out tasks whose writes are saved, so it is also empty
when a node finished but the checkpoint after it was never saved. Outputs always come from the
graph's state, i.e. from the checkpoint. An exception out of ``invoke`` is a crash: the thread
stays resumable and the next process resumes it.

LangGraph has no model-call or shell construct of its own (chat models live in LangChain), so
model steps are plain nodes and the shell tool keeps ``agent.plain_shell``. It gives no per-step
identity recommended for idempotency, so ``send`` gets no key.

Windows: PROMPT and EXEC inside the step bodies (``agent.Trial.run_step``, run by each node);
WRITE at every COMMIT of a transaction that wrote (``watch_sqlite_commits``), which for this saver
is inside ``SqliteSaver.put`` (a checkpoint) or ``SqliteSaver.put_writes`` (a node's writes),
each one transaction committed under the saver's lock: 17 in a clean ``sync`` or ``async`` run
(9 checkpoints, 8 task writes), 1 in ``exit`` (the final checkpoint). LangGraph runs both on its
background executor's threads in every mode: in ``sync`` the main thread waits for each step's
checkpoint (not for the node's writes, which are submitted just before it) before the next step;
in ``async`` it never waits, so later steps go on running while the kill is pending and the N-th
commit is not at the same point of the run from one trial to the next; in ``exit`` the only
commit is at the end of ``invoke``. VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

THREAD_ID = "bench-run"
DB_NAME = "checkpoints.sqlite"


class State(TypedDict, total=False):
    """The run's input topic and each step's output, under the step's name."""

    topic: str
    plan: dict
    search_habitat: dict
    search_diet: dict
    ledger: dict
    shell: dict
    draft: dict
    send: dict


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--durability", choices=("sync", "async", "exit"), default="async")
    parser.add_argument("--check", action="store_true")
    return parser.parse_args(argv)


def main(durability: str) -> None:
    trial = agent.Trial.from_env()
    trial.watch_sqlite_commits()
    started = time.perf_counter()
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    imported = time.perf_counter()

    def node(name: str):  # type: ignore[no-untyped-def]
        def run(state: State) -> dict[str, Any]:
            outputs = {step: state[step] for step in agent.STEP_NAMES if step in state}
            return {name: trial.run_step(name, agent.step_input(name, outputs))}

        run.__name__ = name
        return run

    builder = StateGraph(State)
    previous = START
    for name in agent.STEP_NAMES:
        builder.add_node(name, node(name))
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)

    with SqliteSaver.from_conn_string(str(trial.store / DB_NAME)) as saver:
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": THREAD_ID}}
        trial.ready(
            runtime=f"langgraph-{durability}",
            version=metadata.version("langgraph"),
            import_s=imported - started,
            init_s=time.perf_counter() - imported,
        )
        snapshot = graph.get_state(config)
        if snapshot.created_at is None:  # the thread has no checkpoint: a new run
            graph.invoke({"topic": agent.TOPIC}, config, durability=durability)
        elif snapshot.tasks:  # the last checkpoint's step has tasks: resume the thread
            graph.invoke(None, config, durability=durability)
        final = graph.get_state(config)
    if final.tasks:
        trial.failed(f"the graph stopped with steps left: {[t.name for t in final.tasks]}")
    missing = [name for name in agent.STEP_NAMES if name not in final.values]
    if missing:
        trial.failed(f"the graph ended without outputs for {missing}")
    trial.finish(agent.final_result(final.values))


def check(trial: agent.Trial) -> tuple[bool, str]:
    return agent.sqlite_whole(trial.store / DB_NAME)


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    if args.check:
        agent.check_main(check)
    else:
        main(args.durability)
