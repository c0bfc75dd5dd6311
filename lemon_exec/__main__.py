import sys

from lemon_exec.cli import main

sys.exit(main())
