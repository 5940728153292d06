"""Credential resolution: one resolver per scheme, each value tagged with its source.

See :mod:`tensorstream.credentials.base` for the shared types and
``docs/providers.md`` for the precedence table.
"""
