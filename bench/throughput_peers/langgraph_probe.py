"""The LangGraph probe of the throughput benchmark, run by LangGraph's interpreter
(.bench-venvs/langgraph).

LangGraph is made durable as the durability benchmark's adapter makes it (src/durabl/bench/kit/
run_langgraph.py): a ``StateGraph`` compiled with ``SqliteSaver`` on one SQLite file, invoked
with ``durability="sync"``, so that each step's checkpoint is saved before the next step starts.
The graph is START -> plan -> tool, and tool loops back to itself until it has made 40 calls
(the way a LangGraph agent loops over tool calls); each node makes exactly one model or tool
call, and its output, the ~200-byte tool result included, is in the checkpoint saved after it.
Nothing about SQLite is configured: ``SqliteSaver.from_conn_string`` opens the file (and sets
WAL), and the probe reports that connection's ``journal_mode`` and ``synchronous``.

Concurrency: ``--concurrency`` threads share the one compiled graph and its one saver (whose
connection is guarded by the saver's own lock, as its documentation allows), each run on its own
``thread_id``. Steps are counted afterwards from the saver: the checkpoints of each thread saved
after a node ran (``metadata["step"] >= 1``).
"""

from __future__ import annotations

import operator
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kit

DB_NAME = "checkpoints.sqlite"
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
RECURSION_LIMIT = 4 * kit.STEPS
"""LangGraph stops a graph after 25 steps unless told otherwise; W40 takes 41."""


class State(TypedDict, total=False):
    topic: str
    plan: dict[str, Any]
    last: dict[str, Any]
    hits: Annotated[list[int], operator.add]


def build(saver: Any, outbox: kit.Outbox) -> Any:
    from langgraph.graph import END, START, StateGraph

    def plan(state: State) -> dict[str, Any]:
        return {"plan": kit.stub_model(f"Plan a search about {state['topic']}")}

    def call_tool(state: State) -> dict[str, Any]:
        hit = outbox(len(state.get("hits", [])), state["topic"])
        return {"last": hit, "hits": [hit["i"]]}

    def more(state: State) -> str:
        return "tool" if len(state.get("hits", [])) < kit.TOOL_CALLS else END

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("tool", call_tool)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "tool")
    builder.add_conditional_edges("tool", more, ["tool", END])
    return builder.compile(checkpointer=saver)


def main(args: kit.Args) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    outbox = kit.Outbox(args.work / "outbox", args.sleep_s)
    with SqliteSaver.from_conn_string(str(args.work / DB_NAME)) as saver:
        graph = build(saver, outbox)

        def run_one(k: int) -> Any:
            config = {
                "configurable": {"thread_id": kit.run_id_of(k)},
                "recursion_limit": RECURSION_LIMIT,
            }
            final = graph.invoke({"topic": kit.topic_of(k)}, config, durability="sync")
            return {"plan": final["plan"]["plan"], "hits": len(final["hits"])}

        timing = kit.run_concurrently(args, run_one)
        steps = [steps_of(saver, kit.run_id_of(k)) for k in range(args.runs)]
        settings = sqlite_settings(saver)
    kit.emit(
        args,
        timing,
        steps,
        runtime="langgraph",
        version=metadata.version("langgraph"),
        durability=settings,
        concurrency_by="threads sharing one compiled graph and its SqliteSaver, each on its "
        "own thread_id",
        checkpointer="langgraph-checkpoint-sqlite "
        + metadata.version("langgraph-checkpoint-sqlite"),
        invoke_durability="sync",
    )


def steps_of(saver: Any, thread_id: str) -> int:
    config = {"configurable": {"thread_id": thread_id}}
    return sum(1 for c in saver.list(config) if c.metadata.get("step", -1) >= 1)


def sqlite_settings(saver: Any) -> dict[str, Any]:
    with saver.cursor(transaction=False) as cur:
        journal = cur.execute("PRAGMA journal_mode").fetchone()[0]
        sync = cur.execute("PRAGMA synchronous").fetchone()[0]
    return {
        "mode": "default",
        "journal_mode": journal,
        "synchronous": SYNCHRONOUS.get(sync, str(sync)),
        "sqlite": f"SQLite journal_mode={journal}, synchronous={SYNCHRONOUS.get(sync, sync)} "
        "(as SqliteSaver.from_conn_string opens it)",
    }


if __name__ == "__main__":
    main(kit.parse_args(sys.argv[1:]))
