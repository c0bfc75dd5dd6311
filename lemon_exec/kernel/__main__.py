"""Entry point of the lemon-python kernel: ``python -m lemon_exec.kernel -f FILE``."""

from lemon_exec.kernel.app import main

if __name__ == "__main__":
    main()
