"""Session mode: the registry of persistent kernels, their queues and owners."""
