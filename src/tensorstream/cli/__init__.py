"""The ``tensorstream`` command line (:mod:`tensorstream.cli.main`)."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["entry"]


def entry() -> NoReturn:
    """The process entry point (``tensorstream`` console script, ``python -m
    tensorstream``): import the command line with the cyclic garbage collector
    paused, then :func:`tensorstream.cli.main.entry`.

    Start-up allocates a few hundred thousand objects (modules, functions,
    classes) and frees almost none, so the collections it triggers find
    nothing: importing the command line took 87 -> 81 ms of CPU (8 paired
    fresh processes). What was imported is then frozen (``gc.freeze``):
    later collections, during the command, do not walk it again. Importing
    this package has no such effect; only calling this does, once, in a
    process of its own."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        from .main import entry as run
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    run()
