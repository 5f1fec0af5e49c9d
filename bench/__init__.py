"""durabl's benchmarks. Each runs as ``python -m bench.NAME`` and writes its figures to
``bench/results/NAME.json``; ``make bench`` runs all but ``compare``, which ``make
bench-compare`` runs.

- ``w40.py``: what durabl costs per step and per replayed step, and whether it grows with the log.
- ``workers.py``: how fast worker processes drain a database, and how soon a killed worker's run
  is taken over.
- ``compaction.py``: what compaction does to the file, to replay, history loading and resume.
- ``dashboard.py``: what one dashboard poll costs on a short run and on a long one.
- ``throughput.py``: steps/s with 1, 8 and 64 concurrent runs (and several workers), full and
  process, against DBOS and LangGraph on the same workload; ``throughput_peers/`` holds each
  runtime's probe, run by that runtime's own interpreter.
- ``scale.py``: per-step cost, ``durabl runs`` and the dashboard's polls on a database of
  1,000,000 events and 10,000 runs, and the memory of parked runs and of a long resume.
- ``compare.py``: this checkout's durabl against durabl 0.1.0, side by side in one run;
  ``probe.py`` is what both versions' interpreters run.
- ``harness.py``: what they share: the command line and main loop, the scratch folder, the
  machine and its fsync cost, summaries of samples, and the atomic JSON writer.
- ``workload.py``: the W40 workload; ``worker_app.py``: what a worker process imports to run it.

A benchmark imports the harness and the workload, never another benchmark.
"""
