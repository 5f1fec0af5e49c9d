"""DBOS Transact on SQLite, used as its docs recommend: one ``@DBOS.workflow()`` whose every
workload step is one ``@DBOS.step()`` (DBOS has no model-call construct: model steps are steps
too), a fixed workflow id set with ``SetWorkflowID``, and the system database in a SQLite file
under the trial's store (``system_database_url="sqlite:///..."``).

Starting and resuming: the first process finds no workflow with that id and calls the workflow.
A restarted process does not start anything by hand: ``DBOS.launch()`` finds the PENDING
workflow and re-enqueues it for recovery on its own, and the adapter only takes a handle by id
(``DBOS.retrieve_workflow``) and waits for its result. A workflow already SUCCESS returns its
stored result; one marked MAX_RECOVERY_ATTEMPTS_EXCEEDED is held, one in ERROR failed.

The ``send`` step passes the idempotency key DBOS documents for steps: the workflow id plus the
step id (``DBOS.workflow_id``, ``DBOS.step_id``), both stable across recoveries. The shell tool
runs with ``subprocess.run`` (DBOS offers nothing of its own for it).

Windows: PROMPT and EXEC inside the step bodies; WRITE at every COMMIT of a SQLite transaction
that wrote (``Trial.watch_sqlite_commits``: SQLAlchemy's pysqlite dialect opens its connections
with ``sqlite3.dbapi2.connect``) made on the launching or workflow thread: the schema
migration, the application version, the workflow's status row, each step's output row
(``record_operation_result``) and the workflow's outcome, 11 in a clean run. Commits by DBOS's
background-jobs thread (a sweep of delayed and timed-out workflows, once a second, writing
nothing here) are left out: they fall wherever the clock puts them, so counting them would
make the N-th arrival a different instant from run to run. VERIFY inside ``Trial.finish``.

DBOS is not shut down before the trial ends: its background threads are daemons and its
executor is idle once the result is in, so ``sys.exit`` in ``Trial.finish`` ends the process
at once (``DBOS.destroy()`` would only add about 0.6 s of shutdown to every run).
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

WORKFLOW_ID = "bench-run"
DB_FILE = "dbos.sqlite"


def main() -> None:
    trial = agent.Trial.from_env()
    started = time.perf_counter()
    from dbos import DBOS, DBOSConfig, SetWorkflowID
    from dbos._sys_db import WorkflowStatusString
    from dbos._workflow_commands import BACKGROUND_JOBS_THREAD_NAME

    imported = time.perf_counter()
    # the timed sweeper's commits land wherever the clock puts them: leave them out, so that
    # WRITE:N is the same instant in every run
    trial.watch_sqlite_commits(ignore_threads={BACKGROUND_JOBS_THREAD_NAME})

    config: DBOSConfig = {
        "name": "bench-agent",
        "system_database_url": f"sqlite:///{trial.store / DB_FILE}",
        "log_level": "WARNING",
    }
    DBOS(config=config)

    def as_step(name: str):  # type: ignore[no-untyped-def]
        def body(data: dict) -> dict:
            key = f"{DBOS.workflow_id}-{DBOS.step_id}" if name == "send" else None
            return trial.run_step(name, data, key=key)

        body.__name__ = name
        return DBOS.step(name=name)(body)

    steps = {spec.name: as_step(spec.name) for spec in agent.STEPS}

    @DBOS.workflow(name="bench_agent")
    def bench_agent(topic: str) -> dict:
        outputs: dict = {}
        for spec in agent.STEPS:
            outputs[spec.name] = steps[spec.name](agent.step_input(spec.name, outputs))
        return agent.final_result(outputs)

    DBOS.launch()
    trial.ready(
        runtime="dbos",
        version=importlib.metadata.version("dbos"),
        import_s=imported - started,
        init_s=time.perf_counter() - imported,
    )

    try:
        if DBOS.get_workflow_status(WORKFLOW_ID) is None:
            with SetWorkflowID(WORKFLOW_ID):
                result = bench_agent(agent.TOPIC)
        else:  # launch() has already re-enqueued it if it was pending
            result = DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
    except Exception as exc:
        status = DBOS.get_workflow_status(WORKFLOW_ID)
        state = status.status if status else "unknown"
        if state == WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED.value:
            trial.held(f"{state}: {exc}")
        elif state in (WorkflowStatusString.ERROR.value, WorkflowStatusString.CANCELLED.value):
            trial.failed(f"{state}: {exc}")
        raise
    trial.finish(result)


def check(trial: agent.Trial) -> tuple[bool, str]:
    return agent.sqlite_whole(trial.store / DB_FILE)


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        main()
