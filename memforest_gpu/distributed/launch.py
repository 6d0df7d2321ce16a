"""This process as one rank of a ``torchrun`` launch: its place (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``), its GPU, its process group, and a store file compressed by every rank
(:func:`run_ranks`). Without ``torchrun`` it is the only rank and starts no process group."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .files import compress_file_distributed

__all__ = ["Place", "place", "pin_gpu", "run_ranks", "BACKENDS"]

BACKENDS = ("auto", "nccl", "gloo")  # auto: nccl on CUDA, else gloo


@dataclass(frozen=True)
class Place:
    """Where this process runs: its ``rank`` of ``world`` ranks, the ``backend`` of their
    process group (``none`` for one rank) and its ``device``."""

    rank: int
    world: int
    backend: str
    device: str


def place() -> tuple[int, int]:
    """This process's rank and the number of ranks, from torchrun's environment (``(0, 1)``
    without it)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def pin_gpu() -> None:
    """Give rank LOCAL_RANK only its own GPU, before anything touches CUDA, so that a
    per-rank model (one vLLM engine per GPU) lands on its GPU."""
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    devs = [d for d in vis.split(",") if d.strip()] if vis else None
    if devs == []:
        return  # no GPU visible: CPU run
    os.environ["CUDA_VISIBLE_DEVICES"] = devs[int(local) % len(devs)] if devs else str(local)


def _device(device: str | None, cuda: bool, pinned: bool) -> str:
    """The rank's device: ``device``, else its GPU when there is one, else the CPU."""
    device = device or ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and cuda:
        torch.cuda.set_device(0 if os.environ.get("LOCAL_RANK") and pinned else int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    return device


def run_ranks(src, dst, config, *, backend: str = "auto", device: str | None = None, pin: bool = True, **options):
    """Compress ``src`` into ``dst`` as this rank (:func:`~.files.compress_file_distributed`'s
    ``options``), in a process group of the launch's ranks (``backend``: one of
    :data:`BACKENDS`) that is torn down however the run ends. ``pin``: restrict this rank to
    GPU LOCAL_RANK first (:func:`pin_gpu`). Returns the result and this rank's :class:`Place`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if pin and device != "cpu":
        pin_gpu()
    rank, world = place()
    cuda = torch.cuda.is_available() and device != "cpu"
    dev = _device(device, cuda, pin)
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if world > 1:
        dist.init_process_group(backend)
    try:
        res = compress_file_distributed(src, dst, config, device=dev, **options)
        if world > 1:
            dist.barrier()
        return res, Place(rank, world, backend if world > 1 else "none", dev)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()
