"""``tensorstream inspect URI``: a model file's tensors and metadata, from its header only.

safetensors files, sharded safetensors checkpoints (their index, or the folder
holding it) and tensorizer files (encrypted ones too: their index is in the
clear). The format comes from the file's first bytes. Names are escaped
(a tensor named with terminal escape sequences prints as ``\\x1b[2J``);
``--json`` prints one JSON document with every name exact.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .options import add_storage_options
from .output import escape, escape_name, human_size

EPILOG = """\
examples:
  tensorstream inspect s3://models/llama/model.safetensors
  tensorstream inspect s3://models/llama/                   # the checkpoint's index and shards
  tensorstream inspect https://host/llama/model.safetensors.index.json
  tensorstream inspect --json /models/llama.tensors | jq '.totals'

Only headers and indexes are read (a few ranged reads per file), never tensor data.
exit status: 0 done, 1 not found or not a model file (truncated, malformed), 2 usage."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "inspect", parents=[common], help="list a model file's tensors and metadata",
        usage="tensorstream inspect [options] URI", epilog=EPILOG,
        description="Show the tensors (name, dtype, shape, bytes) and metadata of a "
                    ".safetensors file, a sharded checkpoint (model.safetensors.index.json, "
                    "or the folder holding it) or a tensorizer .tensors file.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("uri", metavar="URI")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_storage_options(p)
    p.set_defaults(handler=run)


#: The widest a column is padded to: a longer cell (a hostile 100,000-character name) is
#: printed whole and pushes only its own row (every row padded to it made 200 MB of output).
MAX_COLUMN = 60


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [min(MAX_COLUMN, max(len(r[i]) for r in rows)) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


def render(info: Any) -> str:
    """The human report of a :class:`~tensorstream.inspection.ModelInfo`."""
    lines = [f"{escape_name(info.uri)}: {info.format}, {len(info.files)} file"
             f"{'s' if len(info.files) != 1 else ''}, {info.size} bytes ({human_size(info.size)})"]
    if info.version is not None:
        lines.append(f"tensorizer data version {info.version}")
    if info.encrypted:
        lines.append("encrypted: tensor data is encrypted (names, dtypes and shapes are stored "
                     "in the clear)")
    for label, meta in (("metadata", info.metadata), ("index metadata", info.index_metadata)):
        if meta:
            items = ", ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in meta.items())
            lines.append(f"{label}: {items}")
    sharded = len(info.files) > 1
    prefix = _common_prefix([u for u, _ in info.files]) if sharded else ""
    header = ["NAME", "DTYPE", "SHAPE", "BYTES"] + (["FILE"] if sharded else [])
    rows = [header]
    # (names as ls shows them, backslashes doubled: a\\nb and a<newline>b print apart)
    for t in info.tensors:
        row = [escape_name(t.name), escape(t.dtype), "[" + ", ".join(map(str, t.shape)) + "]",
               str(t.nbytes)]
        if sharded:
            row.append(escape_name(t.file[len(prefix):]))
        rows.append(row)
    lines += _table(rows, {3})
    hist = ", ".join(f"{escape(d)} {c} ({human_size(b)})" for d, (c, b) in info.dtypes().items())
    lines.append(f"{len(info.tensors)} tensor{'s' if len(info.tensors) != 1 else ''}, "
                 f"{info.total_bytes} bytes ({human_size(info.total_bytes)})"
                 + (f"; dtypes: {hist}" if hist else ""))
    return "\n".join(lines)


def _common_prefix(uris: list[str]) -> str:
    """The folder the files share (shown once, in the first line)."""
    if not uris:
        return ""
    first = uris[0]
    cut = first.rfind("/") + 1
    folder = first[:cut]
    return folder if all(u.startswith(folder) for u in uris) else ""


def run(args: argparse.Namespace) -> int:
    from ..inspection import inspect
    from .options import storage_options

    info = inspect(args.uri, **storage_options(args))
    if args.json:
        print(json.dumps(info.to_dict(), sort_keys=True))
    else:
        print(render(info))
    return 0
