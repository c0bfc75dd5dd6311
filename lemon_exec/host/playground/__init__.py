"""The playground host: serves the helpers of a kernel that no lemon_exec host started.

The kernel starts it (kernel/playground.py) with ``python -m lemon_exec.host.playground``;
the protocol is wire/playground.py, the user's guide docs/playground.md.
"""
