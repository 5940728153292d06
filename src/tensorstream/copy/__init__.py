"""Copy objects between any two backends: parts read concurrently, verified, atomic at the destination.

>>> from tensorstream.copy import copy
>>> copy("s3://bucket/model.tensors", "/mnt/nvme/model.tensors")  # doctest: +SKIP
"""

from .engine import (
    DEFAULT_CONCURRENCY,
    DEFAULT_JOBS,
    DEFAULT_PART_SIZE,
    CopyResult,
    ProgressListener,
    copy,
    copy_async,
    copy_tree,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_JOBS",
    "DEFAULT_PART_SIZE",
    "CopyResult",
    "ProgressListener",
    "copy",
    "copy_async",
    "copy_tree",
]
