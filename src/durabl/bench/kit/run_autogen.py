"""AutoGen AgentChat with ``save_state``/``load_state``, used as AutoGen's state docs show.

One ``AssistantAgent`` whose tools are the workload's five tool steps (plain functions, wrapped by
AutoGen as ``FunctionTool``), with ``max_tool_iterations`` high enough to run the whole task in
one ``run_stream``. Its model client is the only double: ``ScriptedModel``, a
``ChatCompletionClient`` that reads the agent's model context and answers like a model would.
It recovers the step outputs from the context (model outputs from its own earlier messages'
``thought``, tool outputs from the tool results), and asks for the next workload step that has no
output yet as a tool call. When that next step is a model step (plan, draft), the model call
itself is that step: ``create`` runs ``trial.run_step`` for it, reports its token usage and puts
its output in the message's ``thought`` (where AutoGen keeps the text a model returns beside tool
calls). When every step has an output it answers with the run's result as text. Its other turns
(choosing the next tool) bill nothing.

Durability is AutoGen's documented one: ``await agent.save_state()`` gives a dict, written with a
plain ``json.dump`` to ``trial.store / "state.json"`` (no atomic write in the docs), after every
event that grew the agent's state (each model turn, each tool result, the run's end). On restart
the file is read back with ``json.load``, passed to ``agent.load_state``, and the agent is run on
again with no new task, so the model continues from the restored context. A tool call saved
without its result is asked for again (the model sees no output for it). AutoGen has no per-step
identity it recommends for idempotency, so ``send`` gets no key.

Windows: PROMPT inside the model steps (inside ``create``); EXEC inside the tool steps; WRITE in
the middle of writing state.json (half the JSON written and flushed, the rest not), at every save;
VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

TASK = f"Research {agent.TOPIC} and send the summary to {agent.RECIPIENT}."


def main() -> None:
    trial = agent.Trial.from_env()
    started = time.perf_counter()
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.base import TaskResult
    from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent, ToolCallRequestEvent
    from autogen_core import FunctionCall
    from autogen_core.models import (
        AssistantMessage,
        ChatCompletionClient,
        CreateResult,
        FunctionExecutionResultMessage,
        ModelInfo,
        RequestUsage,
    )

    imported = time.perf_counter()

    def recover(messages: Any) -> dict[str, Any]:
        """The step outputs the context holds: the model's thoughts and the tools' results."""
        outputs: dict[str, Any] = {}
        for message in messages:
            if isinstance(message, AssistantMessage) and message.thought:
                said = json.loads(message.thought)
                outputs[said["step"]] = said["output"]
            elif isinstance(message, FunctionExecutionResultMessage):
                for result in message.content:
                    if not result.is_error:
                        outputs[result.name] = json.loads(result.content)
        return outputs

    class ScriptedModel(ChatCompletionClient):
        """A model that follows the workload's script from whatever context it is given."""

        def __init__(self) -> None:
            self._usage = RequestUsage(prompt_tokens=0, completion_tokens=0)
            self._calls = 0

        async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
            outputs = recover(messages)
            pending = [name for name in agent.STEP_NAMES if name not in outputs]
            thought, usage = None, RequestUsage(prompt_tokens=0, completion_tokens=0)
            if pending and agent.SPECS[pending[0]].kind == "model":
                name = pending.pop(0)
                out = trial.run_step(name, agent.step_input(name, outputs))
                outputs[name] = out
                thought = json.dumps({"step": name, "output": out}, sort_keys=True)
                usage = RequestUsage(**out["usage"])
            self._usage = RequestUsage(
                prompt_tokens=self._usage.prompt_tokens + usage.prompt_tokens,
                completion_tokens=self._usage.completion_tokens + usage.completion_tokens,
            )
            if not pending:
                content: Any = json.dumps(agent.final_result(outputs), sort_keys=True)
                return CreateResult(
                    finish_reason="stop", content=content, usage=usage, cached=False
                )
            self._calls += 1
            name = pending[0]
            call = FunctionCall(
                id=f"call_{time.time_ns()}_{self._calls}",
                name=name,
                arguments=json.dumps(agent.step_input(name, outputs)),
            )
            return CreateResult(
                finish_reason="function_calls",
                content=[call],
                usage=usage,
                cached=False,
                thought=thought,
            )

        def create_stream(self, messages: Any, **kwargs: Any) -> Any:
            async def stream() -> Any:
                yield await self.create(messages, **kwargs)

            return stream()

        async def close(self) -> None:
            return None

        def actual_usage(self) -> RequestUsage:
            return self._usage

        def total_usage(self) -> RequestUsage:
            return self._usage

        def count_tokens(self, messages: Any, **kwargs: Any) -> int:
            return 0

        def remaining_tokens(self, messages: Any, **kwargs: Any) -> int:
            return 1_000_000

        @property
        def capabilities(self) -> Any:
            return {"vision": False, "function_calling": True, "json_output": False}

        @property
        def model_info(self) -> ModelInfo:
            return ModelInfo(
                vision=False,
                function_calling=True,
                json_output=False,
                family="unknown",
                structured_output=False,
            )

    def step(name: str, data: dict[str, Any], key: str | None = None) -> str:
        return json.dumps(trial.run_step(name, data, key=key), sort_keys=True)

    def search_habitat(query: str) -> str:
        """Search the web for the habitat angle."""
        return step("search_habitat", {"query": query})

    def search_diet(query: str) -> str:
        """Search the web for the diet angle."""
        return step("search_diet", {"query": query})

    def ledger(topic: str, sources: int) -> str:
        """Record the research in the ledger."""
        return step("ledger", {"topic": topic, "sources": sources})

    def shell(text: str) -> str:
        """Digest the plan's text with a shell command."""
        return step("shell", {"text": text})

    def send(to: str, body: str) -> str:
        """Send the summary by email."""
        return step("send", {"to": to, "body": body})

    assistant = AssistantAgent(
        "researcher",
        model_client=ScriptedModel(),
        tools=[search_habitat, search_diet, ledger, shell, send],
        max_tool_iterations=2 * len(agent.STEPS),
    )
    path = trial.store / "state.json"

    async def save() -> None:
        """AutoGen's save: the agent's state as JSON in one file, WRITE in the middle."""
        state = await assistant.save_state()
        text = json.dumps(state)
        with open(path, "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            trial.arrive("WRITE")
            f.write(text[len(text) // 2 :])

    async def run() -> dict[str, Any]:
        if path.exists():
            with open(path) as f:
                await assistant.load_state(json.load(f))
            stream = assistant.run_stream()
        else:
            stream = assistant.run_stream(task=TASK)
        final: Any = None
        async for event in stream:
            if isinstance(event, (ToolCallRequestEvent, ToolCallExecutionEvent, TaskResult)):
                await save()
            if isinstance(event, TaskResult):
                final = event.messages[-1] if event.messages else None
        if not isinstance(final, TextMessage):
            raise RuntimeError(f"the agent stopped on {type(final).__name__}, not an answer")
        return json.loads(final.content)

    trial.ready(
        runtime="autogen",
        version=metadata.version("autogen-agentchat"),
        import_s=imported - started,
        init_s=time.perf_counter() - imported,
    )
    trial.finish(asyncio.run(run()))


def check(trial: agent.Trial) -> tuple[bool, str]:
    path = trial.store / "state.json"
    if not path.exists():
        return True, "no state.json yet"
    try:
        json.loads(path.read_text())
    except ValueError as exc:
        return False, f"state.json does not parse: {exc}"
    return True, "state.json parses"


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        main()
