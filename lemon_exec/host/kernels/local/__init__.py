"""The local backend: kernel processes on this machine, started through jupyter_client (or
forked from a template), with their connection files, host link and channel readers."""
