"""CrewAI Flows with ``@persist``, used as CrewAI's flow-persistence docs show.

One ``Flow`` with structured state (a ``FlowState`` holding the step outputs), one method per
workload step chained with ``@start``/``@listen``, and the class decorated with
``@persist(SQLiteFlowPersistence(<trial.store>/flow_states.db))``: after each method completes,
CrewAI inserts a snapshot of the whole state into SQLite. The run is started and resumed the
documented way, ``flow.kickoff(inputs={"id": FLOW_ID})``: CrewAI loads the latest snapshot for
that id into the state (the first process finds none and starts fresh). The id is pinned so a
restarted process knows which state to restore.

What a restore does is CrewAI's: it reloads the state but runs the flow from its ``@start``
method again (``kickoff`` with an id only restores state; completed methods are replayed only
when resuming from a checkpoint or human feedback), so every method body runs again with the
restored outputs as its inputs. The methods carry no "already done?" guard, as in the docs.

Model steps call ``trial.run_step`` inside the flow method (the workload's model is a stub, so
CrewAI's ``LLM`` class is not used); tool steps are the flow methods themselves. CrewAI gives no
per-step identity it recommends for idempotency, so ``send`` gets no key. CrewAI telemetry,
tracing and the version check are switched off by environment variables (there is no network),
and ``HOME`` is pointed inside ``trial.store``, so the files CrewAI keeps under the home folder
(its auto-created flow memory, a credentials key) stay in the trial.

Windows: PROMPT and EXEC inside the step bodies; WRITE inside ``SQLiteFlowPersistence.save_state``
at the COMMIT of its INSERT (``Trial.watch_sqlite_commits``: after the snapshot's row, before it
is durable), once per completed method; VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

FLOW_ID = "6f1c2d4e-bench-run-research-agent"
QUIET = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}


def main() -> None:
    trial = agent.Trial.from_env()
    os.environ.update(QUIET)
    os.environ["HOME"] = str(trial.store / "home")  # CrewAI's data and credential folders
    trial.watch_sqlite_commits()
    started = time.perf_counter()
    from crewai.flow.flow import Flow, FlowState, listen, start
    from crewai.flow.persistence import SQLiteFlowPersistence, persist
    from pydantic import Field

    imported = time.perf_counter()

    class BenchState(FlowState):
        outputs: dict[str, Any] = Field(default_factory=dict)

    @persist(SQLiteFlowPersistence(str(trial.store / "flow_states.db")))
    class BenchFlow(Flow[BenchState]):
        """The workload, one flow method per step, in order."""

        def _step(self, name: str) -> dict[str, Any]:
            outputs = self.state.outputs
            outputs[name] = trial.run_step(name, agent.step_input(name, outputs))
            return outputs[name]

        @start()
        def plan(self) -> Any:
            return self._step("plan")

        @listen(plan)
        def search_habitat(self) -> Any:
            return self._step("search_habitat")

        @listen(search_habitat)
        def search_diet(self) -> Any:
            return self._step("search_diet")

        @listen(search_diet)
        def ledger(self) -> Any:
            return self._step("ledger")

        @listen(ledger)
        def shell(self) -> Any:
            return self._step("shell")

        @listen(shell)
        def draft(self) -> Any:
            return self._step("draft")

        @listen(draft)
        def send(self) -> Any:
            self._step("send")
            return agent.final_result(self.state.outputs)

    flow = BenchFlow()
    trial.ready(
        runtime="crewai",
        version=metadata.version("crewai"),
        import_s=imported - started,
        init_s=time.perf_counter() - imported,
    )
    result = flow.kickoff(inputs={"id": FLOW_ID})
    trial.finish(result)


def check(trial: agent.Trial) -> tuple[bool, str]:
    return agent.sqlite_whole(trial.store / "flow_states.db")


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        main()
