"""Process and private-disk primitives, shared by the host and the kernel side."""
