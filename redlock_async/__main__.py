"""``python -m redlock_async``: the ``redlock`` command."""

import sys

from redlock_async.cli import main

sys.exit(main())
