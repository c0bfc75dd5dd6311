"""Entry point of the lemon-python kernel: ``python -m lemon_exec.kernel -f FILE``."""

from lemon_exec.kernel.lean import skip_optional_modules

if __name__ == "__main__":
    skip_optional_modules()
    from lemon_exec.kernel.app import main

    main()
