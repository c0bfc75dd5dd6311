"""The host on disk: staging roots, the runtime base, the live-kernel index, leftover cleanup."""
