"""Benchmarks for durabl. ``python -m bench.w40`` runs the W40 workload (see ``bench/w40.py``)."""
