"""Pytest plugin collecting scenario notebooks (placeholder, being written)."""
