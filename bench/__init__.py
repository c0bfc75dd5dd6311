"""Benchmarks of lemon_exec against the alternatives (``python bench/run.py``; see README.md)."""
