"""Benchmarks for graceful: run each one from the repository root with ``python -m benchmarks.<name>``."""
