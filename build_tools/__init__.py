"""Build-time helpers for setup.py (not shipped in the package)."""
