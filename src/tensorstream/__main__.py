"""``python -m tensorstream``: the ``tensorstream`` command line."""

from .cli.main import entry

entry()
