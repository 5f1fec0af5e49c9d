"""The throughput benchmark's probes (bench/throughput.py): one standalone script per runtime,
run by that runtime's own interpreter, and ``kit``, what they share (standard library only)."""
