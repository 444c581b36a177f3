"""Helpers shared by the tests and the CUDA scripts: inputs, checks against the reference, test axes."""
