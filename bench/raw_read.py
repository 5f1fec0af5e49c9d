"""The floor a resume is measured against: a raw ``sqlite3`` open and read of one run's log, in
a fresh process of its own, printed as one JSON object.

``bench/compare.py`` runs it on a copy of a killed run's files (the file, its WAL and its
shared-memory index), so that this read pays what the resume it is compared with pays: a
first connection in a new process, which recovers the WAL, parses the schema and reads the
rows. It imports only the standard library, so it runs under either side's interpreter.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time

RAW_READ = "SELECT * FROM events WHERE run_id = ? ORDER BY seq"
"""Both versions keep a run's log in ``events`` (run_id, seq, ...); this reads all of it."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/raw_read.py", description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True, help="a copy of the killed run's database")
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    conn = sqlite3.connect(args.db)
    rows = conn.execute(RAW_READ, (args.run_id,)).fetchall()
    raw_read_s = time.perf_counter() - t0
    conn.close()
    print(json.dumps({"raw_read_us": raw_read_s * 1e6, "raw_rows": len(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
