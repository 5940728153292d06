"""``python -m tensorstream``: the ``tensorstream`` command line."""

from .cli import entry

entry()
