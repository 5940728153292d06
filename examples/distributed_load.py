"""Load one model on every rank of a torch.distributed group, reading it from storage once.

Under torchrun (one process per rank; torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...)::

    torchrun --nproc-per-node 4 examples/distributed_load.py s3://bucket/model.tensors

or without a launcher, spawning the ranks itself (torch.multiprocessing.spawn)::

    python examples/distributed_load.py --spawn 4 https://host/model.safetensors

A ``.safetensors`` URI (or an index / folder ending in ``/``) is loaded with
``tensorstream.safetensors.load``, anything else with ``tensorstream.deserialize``
(tensorizer). ``--device cuda`` puts rank N's tensors on ``cuda:N`` and uses NCCL;
the default is the CPU and gloo. Each rank prints one line: how many tensors it
holds, a checksum of them (the same on every rank) and, for tensorizer files, the
bytes this rank pulled from storage. Storage options (credentials, endpoints) come
from the environment as usual (``AWS_*``, ``S3_*``...).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tensorstream


def checksum(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def load(uri: str, device: str) -> tuple[dict[str, torch.Tensor], str]:
    """Every tensor of ``uri`` on ``device``; the group reads it once (group="auto")."""
    path = uri.split("?", 1)[0]
    if path.endswith((".safetensors", ".json", "/")):
        return tensorstream.safetensors.load(uri, device, group="auto"), ""
    with tensorstream.deserialize(uri, device=device, group="auto") as sd:
        tensors = {name: sd[name] for name in sd}
        return tensors, f", pulled {sd.stats.bytes / 2**20:.1f} MiB from storage"


def run(rank: int, world_size: int, uri: str, device: str, init_method: str | None) -> None:
    """One rank: join the group, load, report."""
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group(backend, init_method=init_method or "env://", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(minutes=10))
    try:
        started = time.perf_counter()
        tensors, pulled = load(uri, device)
        seconds = time.perf_counter() - started
        line = (f"rank {rank}/{world_size}: {len(tensors)} tensors, checksum "
                f"{checksum(tensors)}, {seconds:.2f} s{pulled}\n")
        os.write(1, line.encode())  # one write: ranks sharing a pipe never interleave a line
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("uri", help="the model: a tensorizer file, a .safetensors, an index")
    parser.add_argument("--spawn", type=int, metavar="N", default=0,
                        help="start N ranks here (torch.multiprocessing.spawn) instead of torchrun")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.spawn:
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(run, args=(args.spawn, args.uri, args.device, init), nprocs=args.spawn)
    else:  # torchrun (or any launcher that sets RANK and WORLD_SIZE)
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.uri, args.device, None)


if __name__ == "__main__":
    main()
