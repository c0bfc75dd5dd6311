"""One script cell on a kernel: running it, the bridge that serves its frames, its output."""
