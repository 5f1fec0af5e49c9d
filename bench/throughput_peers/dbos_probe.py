"""The DBOS Transact probe of the throughput benchmark, run by DBOS's interpreter
(.bench-venvs/dbos).

DBOS is set up as the durability benchmark's adapter sets it up (src/durabl/bench/kit/
run_dbos.py): the system database in a SQLite file (``system_database_url="sqlite:///..."``),
one ``@DBOS.workflow()`` whose model call and every tool call is a ``@DBOS.step()``, each run
under its own workflow id (``SetWorkflowID``). Nothing about durability is configured: the
probe measures DBOS's SQLite as DBOS opens it, and reports the ``journal_mode`` and
``synchronous`` of a connection from DBOS's own pool.

Concurrency: ``--concurrency`` threads each call the workflow function, which runs the workflow
in the calling thread, as a DBOS application serving requests from a thread pool does; the same
shape as durabl's threads calling ``rt.start``. (A DBOS queue would dispatch the same workflows
onto DBOS's executor after a poll of the queue table; calling directly leaves the poll interval
out of the figure.) Steps are counted afterwards from DBOS's records:
``DBOS.list_workflow_steps`` of each workflow, which must be SUCCESS.

``--db URL`` puts the system database elsewhere (``system_database_url=URL``; a
``postgresql://`` URL puts it on PostgreSQL, through SQLAlchemy and psycopg 3, which DBOS
requires), and the probe reports that server's ``synchronous_commit`` as DBOS's pool sees it.
``overhead`` as the first argument times pairs in one thread instead (``kit.time_pairs``): the
plain loop, then one workflow, for the per-step overhead over the plain loop.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kit

DB_NAME = "dbos.sqlite"
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def main(args: kit.Args, pairs: bool = False) -> None:
    from dbos import DBOS, DBOSConfig, SetWorkflowID

    url = args.db or f"sqlite:///{args.work / DB_NAME}"
    config: DBOSConfig = {
        "name": "throughput-probe",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    outbox = kit.Outbox(args.work / "outbox", args.sleep_s)

    @DBOS.step(name="model")
    def model(prompt: str) -> dict[str, Any]:
        return kit.stub_model(prompt)

    @DBOS.step(name="append_line")
    def append_line(i: int, topic: str) -> dict[str, Any]:
        return outbox(i, topic)

    @DBOS.workflow(name="w40")
    def w40(topic: str) -> dict[str, Any]:
        plan = model(f"Plan a search about {topic}")
        found = []
        for i in range(kit.TOOL_CALLS):
            hit = append_line(i, topic)
            found.append(hit["i"])
        return {"plan": plan["plan"], "hits": len(found)}

    DBOS.launch()

    def run_one(k: int) -> Any:
        with SetWorkflowID(kit.run_id_of(k)):
            return w40(kit.topic_of(k))

    timing = (kit.time_pairs if pairs else kit.run_concurrently)(args, run_one)
    steps = [steps_of(DBOS, kit.run_id_of(k)) for k in range(args.runs)]
    durability = postgres_settings() if url.startswith("postgresql") else sqlite_settings()
    DBOS.destroy()  # its background threads and connections, before the process exits
    kit.emit(
        args,
        timing,
        steps,
        runtime="dbos",
        version=metadata.version("dbos"),
        durability=durability,
        concurrency_by="threads, each calling the @DBOS.workflow function under its own "
        "SetWorkflowID",
    )


def steps_of(dbos: Any, workflow_id: str) -> int:
    status = dbos.get_workflow_status(workflow_id)
    if status is None or status.status != "SUCCESS":
        raise kit.ProbeError(f"workflow {workflow_id} is {status and status.status}")
    return len(dbos.list_workflow_steps(workflow_id))


def sqlite_settings() -> dict[str, Any]:
    """The settings of a connection from DBOS's system-database pool (DBOS exposes no public
    handle on its engine, so this reads it from the instance), and the pool's size."""
    from dbos._dbos import _get_dbos_instance

    engine = _get_dbos_instance()._sys_db.engine
    with engine.connect() as conn:
        journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    return {
        "mode": "default",
        "journal_mode": journal,
        "synchronous": SYNCHRONOUS.get(sync, str(sync)),
        "pool_size": engine.pool.size(),
        "sqlite": f"SQLite journal_mode={journal}, synchronous={SYNCHRONOUS.get(sync, sync)} "
        "(as DBOS opens it)",
    }


def postgres_settings() -> dict[str, Any]:
    """What a connection from DBOS's system-database pool says of its server (read from the
    instance, as ``sqlite_settings`` does), and the pool's size."""
    from dbos._dbos import _get_dbos_instance

    engine = _get_dbos_instance()._sys_db.engine
    with engine.connect() as conn:
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
        version = conn.exec_driver_sql("SHOW server_version").scalar()
    return {
        "mode": "default",
        "synchronous_commit": sync,
        "server_version": version,
        "driver": engine.url.drivername,
        "pool_size": engine.pool.size(),
        "postgres": f"PostgreSQL {version}, synchronous_commit={sync} (as DBOS's pool sees it)",
    }


if __name__ == "__main__":
    overhead = sys.argv[1:2] == ["overhead"]
    main(kit.parse_args(sys.argv[2:] if overhead else sys.argv[1:]), pairs=overhead)
