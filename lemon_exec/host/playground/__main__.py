"""``python -m lemon_exec.host.playground``: run as a kernel's own host (wire/playground.py)."""

import sys

from lemon_exec.host.playground.server import main

sys.exit(main())
