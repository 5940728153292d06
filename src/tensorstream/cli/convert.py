"""``tensorstream convert SRC DST``: safetensors <-> tensorizer, streamed, on any backend."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .options import (
    add_no_fsync_option,
    add_output_options,
    add_side_options,
    add_storage_options,
    side_options,
    storage_options,
)
from .output import escape, human_rate, human_size
from .progress import make_progress

USAGE = "tensorstream convert [options] SRC DST"
DESCRIPTION = """\
Convert a safetensors checkpoint (one .safetensors file, a
model.safetensors.index.json with its shards, or a folder/prefix holding one)
into one tensorizer .tensors file, or a tensorizer file into one
.safetensors file; the format of SRC is read from its first bytes. Both can
be on any backend. Tensors are streamed (no model is built): memory stays at
about 64 MiB of tensors (or one larger tensor), the one being read and 64 MiB
of read-ahead, whatever the model's size. Writing a tensorizer file to a
remote DST goes through one local temporary file (tensorizer seeks back into
what it wrote); it is deleted afterwards.

DST appears whole or not at all, and an existing DST is refused unless
--overwrite. A DST ending in '/' (or an existing directory) gets the source's
name with the new suffix. Bytes are copied unchanged; names are the
checkpoint's; a .safetensors DST is laid out as safetensors' save_file
lays it out (every tensor aligned). safetensors metadata cannot be kept in a tensorizer file (a
note says so); a converted .safetensors gets {"format": "pt"}."""

EPILOG = """\
examples:
  # a sharded Hugging Face checkpoint on S3 to one tensorizer file next to it
  tensorstream convert s3://models/llama/ s3://models/llama/model.tensors
  # encrypted with a key file (a new random key is written there if it does not exist)
  tensorstream convert --keyfile s3://keys/llama.key ./llama/ s3://models/llama.tensors
  # back to safetensors, decrypting with the same key
  tensorstream convert --keyfile s3://keys/llama.key s3://models/llama.tensors ./llama.safetensors
  # a passphrase, read from an environment variable (never from argv)
  LLAMA_PASS=... tensorstream convert --passphrase-env LLAMA_PASS ./llama/ ./llama.tensors

exit status: 0 converted; 1 failed (nothing written at DST); 2 usage or
configuration error; 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP
(temporary files removed)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "convert", parents=[common], usage=USAGE,
        help="safetensors <-> tensorizer, tensor by tensor, any backend",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help=argparse.SUPPRESS)
    p.add_argument("dst", metavar="DST", help=argparse.SUPPRESS)
    enc = p.add_argument_group("encryption (tensorizer side)")
    how = enc.add_mutually_exclusive_group()
    how.add_argument("--keyfile", metavar="URI",
                     help="32-byte key file on any backend (vLLM's encryption_keyfile): "
                          "encrypts a tensorizer DST (a new random key is written to URI if "
                          "it does not exist) or decrypts a tensorizer SRC")
    how.add_argument("--passphrase-env", metavar="NAME",
                     help="take a passphrase from environment variable NAME (Argon2id; the "
                          "salt is stored in the file)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.add_argument("--no-verify-hash", dest="verify_hash", action="store_false", default=None,
                   help="do not check a tensorizer SRC's tensors against their stored hashes "
                        "(checked by default: a damaged byte fails the conversion and nothing "
                        "is written)")
    add_no_fsync_option(p, target="a local DST")
    add_output_options(p, json_help="print the result as one JSON object")
    add_storage_options(p)
    add_side_options(p)
    p.set_defaults(handler=run)


def _encryption(args: argparse.Namespace) -> Any:
    from ..errors import ConfigurationError
    from ..tensorizer.crypto import Encryption

    if args.keyfile:
        return Encryption(keyfile=args.keyfile)
    if args.passphrase_env:
        value = os.environ.get(args.passphrase_env)
        if not value:
            raise ConfigurationError(f"--passphrase-env {args.passphrase_env}: that environment "
                                     "variable is not set or empty")
        return Encryption(passphrase=value)
    return None


def run(args: argparse.Namespace) -> int:
    from ..conversion.api import convert
    from ..tensorizer.crypto import DecryptionError, TensorHashMismatchError
    from ..uri import redact_text
    from ._run import EXIT_OK, PROG, sigterm_interrupts

    if "-" in (args.src, args.dst):
        from ..errors import ConfigurationError

        # cp's "-" is stdin/stdout; here it was a file named "-" in the current directory
        raise ConfigurationError(
            "convert reads and writes named objects, not stdin or stdout ('-'): the formats "
            "are read and written out of order; name a file (./- for one named '-')")
    options = storage_options(args)
    src_options, dst_options = side_options(args, "src"), side_options(args, "dst")
    encryption = _encryption(args)
    bars = make_progress(args.progress and not args.quiet)
    label = os.path.basename(args.dst.rstrip("/")) or args.dst
    shown = [-1]  # bytes the bar shows; -1: not started

    def progress(done: int, total: int) -> None:
        if bars is None:
            return
        if shown[0] < 0:
            bars.start(1, total)
            bars.file_started(label, total)
            shown[0] = 0
        bars.advance(label, done - shown[0])
        shown[0] = done

    ok = False
    try:
        with sigterm_interrupts():  # cleaned up as for Ctrl-C: nothing is left at DST
            result = convert(args.src, args.dst, encryption=encryption,
                             overwrite=args.overwrite, durable=args.durable, progress=progress,
                             verify_hash=args.verify_hash,
                             src_options=src_options, dst_options=dst_options, **options)
        ok = True
    except TensorHashMismatchError as exc:
        raise TensorHashMismatchError(f"{exc}: SRC is damaged and nothing was written "
                                      "(--no-verify-hash converts it as it is)") from None
    except DecryptionError as exc:
        if encryption is not None or "no key was given" not in str(exc):
            raise
        # The library's advice names Python arguments; here they are flags.
        raise DecryptionError(f"{redact_text(args.src)} is encrypted and no key was given: "
                              "pass --keyfile URI or --passphrase-env NAME") from None
    finally:
        if bars is not None:
            if shown[0] >= 0:
                bars.file_finished(label, ok)
            bars.close()
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True), flush=True)
        return EXIT_OK
    if not args.quiet:
        for note in result.notes:
            print(f"{PROG}: note: {escape(note)}", file=sys.stderr)
        rate = human_rate(result.bytes, result.seconds)
        print(f"convert: {escape(result.src)} -> {escape(result.dst)} ({result.src_format} -> "
              f"{result.dst_format}, {result.tensors} tensors, {human_size(result.bytes)} in "
              f"{result.seconds:.1f}s{', ' + rate if rate else ''}"
              f"{', encrypted' if result.encrypted and result.dst_format == 'tensorizer' else ''})")
    return EXIT_OK
