"""Notebook scenarios: run notebooks as sequences of execute_code calls."""
