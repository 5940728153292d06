"""``python -m tensorstream``: the ``tensorstream`` command line."""

import sys

from .cli.main import main

sys.exit(main())
