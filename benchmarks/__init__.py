"""Benchmarks of mla_ext.decode; run from the repository root, e.g. python3 -m benchmarks.bench."""
