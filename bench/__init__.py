"""durabl's benchmarks. Each runs as ``python -m bench.NAME`` (``make bench`` runs all three)
and writes its figures to ``bench/results/NAME.json``.

- ``w40.py``: what durabl costs per step and per replayed step, and whether it grows with the log.
- ``workers.py``: how fast worker processes drain a database, and how soon a killed worker's run
  is taken over.
- ``compaction.py``: what compaction does to the file, to replay, history loading and resume.
- ``harness.py``: what they share: the command line and main loop, the scratch folder, the
  machine and its fsync cost, summaries of samples, and the atomic JSON writer.
- ``workload.py``: the W40 workload (w40 and workers); ``worker_app.py``: what a worker process
  imports to run it.

A benchmark imports the harness and the workload, never another benchmark.
"""
