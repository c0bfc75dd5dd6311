"""The kernel side of lemon_exec: the ``lemon-python`` Jupyter kernel.

Everything under this package runs inside the kernel process, possibly under another
interpreter than the host's, so it imports only the standard library, ipykernel and comm
(never ``jupyter_client`` or any host module). The host puts this package on the kernel
interpreter's path; ``python -m lemon_exec.kernel -f CONNECTION_FILE`` starts it.
"""
