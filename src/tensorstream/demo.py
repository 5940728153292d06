"""The 30-second demo: ``python -m tensorstream.demo``.

Builds a small transformer-shaped state dict, serializes it with tensorizer,
serves the file from an HTTP server on loopback that the demo starts itself
(offline, nothing to set up), then loads it twice, side by side:

* through tensorstream (``tensorstream.deserialize(url)``: tensorstream's own
  HTTP read path, streamed or ranged, with retries and ETag pinning), and
* through tensorizer's own HTTP stream (``TensorDeserializer(url)``, curl),

checks every tensor of both loads and prints each one's time and rate.
Errors are one line on stderr (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any


def build_state_dict(size_mib: int, seed: int = 0) -> dict[str, Any]:
    """fp16 tensors shaped like a small transformer's layers, ~``size_mib`` MiB."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden = 1024
    per_layer = (4 * hidden * hidden + 2 * hidden * 4 * hidden) * 2  # bytes (fp16)
    layers = max(1, (size_mib << 20) // per_layer)
    sd: dict[str, Any] = {}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"attn.{name}.weight"] = torch.randn(hidden, hidden, generator=gen).half()
        sd[p + "mlp.up.weight"] = torch.randn(4 * hidden, hidden, generator=gen).half()
        sd[p + "mlp.down.weight"] = torch.randn(hidden, 4 * hidden, generator=gen).half()
        sd[p + "norm.weight"] = torch.ones(hidden).half()
    return sd


def _mismatched(loaded: Any, expected: dict[str, Any]) -> list[str]:
    import torch

    names = {k.lstrip("."): k for k in loaded}
    return [
        name for name, t in expected.items()
        if name not in names or not torch.equal(loaded[names[name]].cpu(), t)
    ]


@contextlib.contextmanager
def _file_for(path: str | None) -> Iterator[str]:
    """``path``, or a temporary file removed when the demo ends."""
    if path:
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="tensorstream-demo-")
    try:
        yield os.path.join(tmp, "model.tensors")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_tensorstream(url: str, device: str, expected: dict[str, Any]) -> tuple[float, Any]:
    import tensorstream

    start = time.perf_counter()
    with tensorstream.deserialize(url, device=device) as loaded:
        seconds = time.perf_counter() - start
        stats = loaded.stats
        bad = _mismatched(loaded, expected)
    if bad:
        raise AssertionError(f"tensorstream loaded {len(bad)} wrong tensor(s): {bad[:3]}")
    return seconds, stats


def _load_tensorizer(url: str, device: str, expected: dict[str, Any]) -> float:
    from tensorizer import TensorDeserializer

    start = time.perf_counter()
    with TensorDeserializer(url, device=device) as loaded:  # tensorizer's own curl stream
        seconds = time.perf_counter() - start
        bad = _mismatched(loaded, expected)
    if bad:
        raise AssertionError(f"tensorizer loaded {len(bad)} wrong tensor(s): {bad[:3]}")
    return seconds


def _serve(file: str, key: str, ready: Any, stop: Any) -> None:
    """Child process: serve ``file`` at ``key`` over HTTP on loopback until ``stop`` is set."""
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # clients that stop reading early
    from .testing.http_server import HTTPTestServer

    with HTTPTestServer() as server, open(file, "rb") as f:
        server.put(key, f.read())
        ready.put(server.url(key))
        stop.wait()


@contextlib.contextmanager
def _http_server(file: str) -> Iterator[str]:
    """The URL of ``file`` on an HTTP server (Range, ETag) in a child process: the
    server's work does not compete with the loaders for this process's GIL."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(file, "demo/model.tensors", ready, stop), daemon=True)
    proc.start()
    try:
        try:
            url = ready.get(timeout=60)
        except Exception as exc:
            raise OSError("the demo's HTTP server did not start within 60 s") from exc
        yield str(url)
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def run(size_mib: int, device: str, path: str | None, rounds: int) -> int:
    import torch  # noqa: F401  (fail early and clearly if torch is missing)
    from tensorizer import TensorSerializer

    from .tensorizer.arguments import check_device

    check_device(device)  # a clear error before minutes of work
    state_dict = build_state_dict(size_mib)
    with contextlib.ExitStack() as stack:
        file = stack.enter_context(_file_for(path))
        serializer = TensorSerializer(file)
        serializer.write_state_dict(state_dict)
        serializer.close()
        size = os.path.getsize(file)
        where = f", kept at {path}" if path else ""
        print(f"model: {len(state_dict)} tensors, {size / 2**20:.1f} MiB, serialized by "
              f"tensorizer{where}")
        url = stack.enter_context(_http_server(file))
        print(f"served by an HTTP server on loopback (a child process of the demo): {url}")
        curl = shutil.which("curl") is not None
        best_ts = best_tz = float("inf")
        stats = None
        for i in range(rounds):
            # Alternate who goes first: the second load of a round finds warmer caches.
            order = ("ts", "tz") if i % 2 == 0 else ("tz", "ts")
            for who in order:
                if who == "ts":
                    seconds, st = _load_tensorstream(url, device, state_dict)
                    if seconds < best_ts:
                        best_ts, stats = seconds, st
                elif curl:
                    best_tz = min(best_tz, _load_tensorizer(url, device, state_dict))
    assert stats is not None

    def line(name: str, seconds: float, extra: str) -> str:
        return (f"  {name:<34} {seconds:7.3f} s  {size / seconds / 1e9:6.2f} GB/s  {extra}")

    print(f"loaded onto {device}, every tensor verified (best of {rounds}):")
    print(line("tensorstream.deserialize(url)", best_ts,
               f"path={stats.path} readers={stats.readers} requests={stats.requests} "
               f"retries={stats.retries}"))
    if curl:
        print(line("tensorizer TensorDeserializer(url)", best_tz, "tensorizer's curl stream"))
        print(f"  tensorstream / tensorizer time: {best_ts / best_tz:.2f}x")
    else:
        print("  tensorizer TensorDeserializer(url): not run (tensorizer's HTTP stream needs "
              "curl, which is not installed)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorstream.demo",
        description="Serialize a synthetic model with tensorizer, serve it over HTTP on loopback, "
                    "and load it through tensorstream and through tensorizer's own stream.",
    )
    parser.add_argument("--size-mib", type=int, default=256,
                        help="model size, rounded down to whole layers of 24 MiB "
                             "(default 256: 240 MiB)")
    parser.add_argument("--path", help="keep the .tensors file here (default: a temporary file)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="loads per contender, order alternated; the best is shown (default 2)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show tensorstream's load log (INFO) and read-path decisions (DEBUG)")
    args = parser.parse_args(argv)
    if args.size_mib < 1 or args.rounds < 1:
        parser.error("--size-mib and --rounds must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("tensorstream").setLevel(logging.DEBUG)
    from .errors import TensorstreamError

    try:
        return run(args.size_mib, args.device, args.path, args.rounds)
    except (TensorstreamError, OSError, AssertionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
