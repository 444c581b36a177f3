"""Maintenance scripts; the Python ones run as modules from the repository root, e.g. python3 -m scripts.fuzz_cuda."""
