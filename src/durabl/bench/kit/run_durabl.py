"""durabl, used as its README recommends: one workflow, tools with their modes, the default
``durability="full"`` (every commit fsync'd).

The steps map one to one: model steps are ``ModelCall``; ``search_*`` and ``shell`` are
IDEMPOTENT tools (their effect overwrites the same file), ``ledger`` is AT_MOST_ONCE (appending
twice would be a duplicate, so a crash inside it dead-letters the run for an operator), and
``send`` is IDEMPOTENT with durabl's idempotency key, which the outbox dedupes on. The shell tool
runs its command with ``durabl.shell.run_command`` (own process group, PR_SET_PDEATHSIG and a
guard process).

Windows: PROMPT and EXEC inside the step bodies; WRITE at durabl's own crash points of the
commit path (after STEP_STARTED, after TOOL_DISPATCHED, after a tool or model returned, after a
step committed, before RUN_COMPLETED) and at every COMMIT of a transaction that wrote (after its
rows, before they are durable); VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

RUN_ID = "bench-run"


def main() -> None:
    trial = agent.Trial.from_env()
    trial.watch_sqlite_commits()
    started = time.perf_counter()
    import durabl
    from durabl import ModelCall, Runtime, ToolCall, crashpoints, events, tool, workflow
    from durabl.shell import run_command

    imported = time.perf_counter()
    commit_path = {
        crashpoints.AFTER_STEP_STARTED,
        crashpoints.AFTER_TOOL_DISPATCHED,
        crashpoints.AFTER_TOOL_RETURNED,
        crashpoints.AFTER_MODEL_RETURNED,
        crashpoints.AFTER_STEP_COMMITTED,
        crashpoints.BEFORE_RUN_COMPLETED,
    }
    crashpoints.install(lambda point: trial.arrive("WRITE") if point in commit_path else None)
    trial.shell_runner = lambda argv: run_command(argv, check=False)["returncode"]

    @workflow(name="bench_agent")
    def bench_agent(ctx, topic):  # type: ignore[no-untyped-def]
        outputs: dict = {}
        for spec in agent.STEPS:
            data = agent.step_input(spec.name, outputs)
            if spec.kind == "model":
                outputs[spec.name] = yield ModelCall(data, step=spec.name)
            else:
                outputs[spec.name] = yield ToolCall(spec.name, data)
        return agent.final_result(outputs)

    def llm(prompt, *, step):  # type: ignore[no-untyped-def]
        return trial.run_step(step, prompt)

    def step_tool(name: str):  # type: ignore[no-untyped-def]
        return lambda **data: trial.run_step(name, data)

    def send(*, to, body, idempotency_key):  # type: ignore[no-untyped-def]
        return trial.run_step("send", {"to": to, "body": body}, key=idempotency_key)

    tools = {
        "search_habitat": tool(
            step_tool("search_habitat"), name="search_habitat", mode="IDEMPOTENT"
        ),
        "search_diet": tool(step_tool("search_diet"), name="search_diet", mode="IDEMPOTENT"),
        "ledger": tool(step_tool("ledger"), name="ledger", mode="AT_MOST_ONCE"),
        "shell": tool(step_tool("shell"), name="shell", mode="IDEMPOTENT"),
        "send": tool(send, name="send", mode="IDEMPOTENT"),
    }
    rt = Runtime(trial.store / "agent.db", llm=llm, tools=tools, workflows=[bench_agent])
    trial.ready(
        runtime="durabl",
        version=durabl.__version__,
        import_s=imported - started,
        init_s=time.perf_counter() - imported,
    )
    state = rt.run(bench_agent, {"topic": agent.TOPIC}, run_id=RUN_ID)
    if state.status == events.COMPLETED:
        trial.finish(state.result)
    elif state.status in (events.DEAD_LETTERED, events.HELD):
        trial.held(f"{state.status}: {state.error or state.next_step}")
    else:
        trial.failed(f"{state.status}: {state.error}")


def check(trial: agent.Trial) -> tuple[bool, str]:
    from durabl.store import doctor

    path = trial.store / "agent.db"
    if not path.exists():
        return True, "no database yet"
    problems = [f.message for f in doctor.examine(str(path)) if not f.ok]
    return not problems, "; ".join(problems)[:300] or "doctor: every check passed"


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        main()
