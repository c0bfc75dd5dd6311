"""Kernel backends (local and gateway), the engine that supervises them, and what a kernel
runs under (resource limits, the sandbox, its start deadline)."""
