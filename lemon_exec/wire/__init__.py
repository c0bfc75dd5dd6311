"""The lemon comm protocol and its framing: what host and kernel both speak."""
