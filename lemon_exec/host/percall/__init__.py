"""Per-call runs: admission control and the pool of warm spares."""
