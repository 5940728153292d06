"""``cp``/``sync`` within one S3 store, the neighbours of :mod:`test_copy_server_side`:
what the summary says of bytes that never crossed this machine, keys that must be
encoded in ``x-amz-copy-source``, objects of 0 bytes, a source gone or replaced between
the listing and the copy. moto's server on loopback behind the package's fault proxy."""

from __future__ import annotations

import os
from typing import Any

from tensorstream.copy.engine import copy

MiB = 1 << 20


def test_bytes_s3_copied_are_no_throughput_of_this_machine(tensorstream_s3: Any) -> None:
    """The summary's rate (``gbps``, and the CLI's "MiB/s") divided every copied byte by
    the seconds, those S3 copied itself too: a 100 GiB copy made by S3 in 20 s was
    "5 GiB/s" through a machine that moved none of it. Those bytes are now counted apart
    (``server_side_bytes``) and left out of the rate; a streamed copy still has one."""
    b = tensorstream_s3
    b.put("src/a.bin", os.urandom(MiB))
    r = copy(b.uri("src/a.bin"), b.uri("dst/a.bin"), **b.options)
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert r.bytes == MiB and r.server_side_bytes == MiB and r.gbps == 0.0
    assert r.to_dict()["server_side_bytes"] == MiB and r.to_dict()["gbps"] == 0.0
    r = copy(b.uri("src/a.bin"), b.uri("dst/b.bin"), server_side_copy=False, **b.options)
    assert r.ok and r.server_side_bytes == 0 and r.gbps > 0, r.errors
