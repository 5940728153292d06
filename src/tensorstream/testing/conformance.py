"""The provider conformance suite, shipped in the package so third-party
providers can run the same tests as the built-in ones.

Use it by subclassing :class:`ProviderConformance` and supplying one fixture::

    from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance

    class TestMyProvider(ProviderConformance):
        @pytest.fixture
        def target(self, my_server) -> ConformanceTarget:
            return ConformanceTarget(
                uri=lambda key: f"my://{my_server.address}/{key}",
                put=my_server.put,          # stores bytes without tensorstream
                options={"token": "..."},
            )

Tests are enabled by the provider's declared capabilities (writes, list,
delete, blocking reads, range streams), never by what the target says: a
capability that is declared is exercised, one that is not must fail in the
layer with :class:`~tensorstream.errors.UnsupportedOperationError`.

Beyond ranges and writes, the suite holds every provider to the contract of
the layers: a read of an object replaced between reads raises
:class:`~tensorstream.errors.ObjectChangedError` (async, blocking and streamed
paths), a broken body reports the bytes it delivered
(``IncompleteReadError.received``) and is resumed exactly, ``timeout_total``
and ``timeout_idle`` cut off a server that trickles or stalls, and options are
validated. Tests that need fault injection run when the target has ``faults``
(a :class:`tensorstream.testing.backends.Faults`, e.g.
``ConformanceTarget.from_backend(tensorstream_s3)`` with the pytest plugin's
backends); they are skipped otherwise.
"""

from __future__ import annotations

from .conformance_base import ConformanceTarget
from .conformance_layers import ConformanceLayers
from .conformance_operations import ConformanceOperations
from .conformance_reads import ConformanceReads

__all__ = ["ConformanceTarget", "ProviderConformance"]


class ProviderConformance(ConformanceReads, ConformanceOperations, ConformanceLayers):
    """Every provider passes these. Subclasses provide a ``target`` fixture.

    The tests are in groups: reads (:class:`~.conformance_reads.ConformanceReads`),
    operations (:class:`~.conformance_operations.ConformanceOperations`) and the
    layers' contract (:class:`~.conformance_layers.ConformanceLayers`); fixtures
    and helpers in :class:`~.conformance_base.ConformanceBase`."""
