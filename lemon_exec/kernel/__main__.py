"""Entry point of the lemon-python kernel: ``python -m lemon_exec.kernel -f FILE``.

``python -m lemon_exec.kernel install [--user|--sys-prefix|--prefix P]`` installs its
kernelspec: this process is handed over (``os.execv``, same interpreter, same arguments) to
``python -m lemon_exec kernelspec install ...``, the CLI's command, so that the kernel side
never imports the CLI.
"""

import os
import sys

from lemon_exec.kernel.lean import skip_optional_modules
from lemon_exec.proc.supervise import connection_file_arg, supervise_kernel

if __name__ == "__main__" and sys.argv[1:2] == ["install"]:
    # Not ipykernel's install (a plain ipykernel spec): lemon-python run by this Python.
    command = [sys.executable, "-m", "lemon_exec", "kernelspec", "install", *sys.argv[2:]]
    sys.stdout.flush()
    os.execv(sys.executable, command)
elif __name__ == "__main__":
    # jupyter_client names the launching process here. Our parent watch replaces
    # ipykernel's (it polls once a second and exits without killing the kernel's
    # descendants), which reads this variable when ipykernel is imported.
    parent = os.environ.pop("JPY_PARENT_PID", "")
    supervise_kernel(connection_file_arg(sys.argv[1:]), int(parent) if parent.isdigit() else None)
    skip_optional_modules()
    from lemon_exec.kernel.app import main

    main()
