"""What every step of the GPU verification run shares: its context (sizes, device, the
record writer) and a fast synthetic store. Imports nothing heavy at module level."""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from gpu_record import RECORDS, append_record  # noqa: E402

__all__ = ["Ctx", "fast_store", "frac_equal", "noisy_queries"]


class Ctx:
    """What a step needs: sizes, the device, and ``emit`` (one record, written at once)."""

    def __init__(self, step: str, out: str, rehearse: bool, size: dict):
        import torch

        self.step, self.out, self.rehearse = step, out, rehearse
        self.size = size
        self.dev = torch.device("cpu" if rehearse else "cuda")
        self.device_name = "cpu" if rehearse else torch.cuda.get_device_name(0)
        self.deadline = time.perf_counter() + float(os.environ.get("MEMFOREST_STEP_LIMIT", "600"))
        self.emit = partial(append_record, os.path.join(out, RECORDS), step=step, device=self.device_name,
                            rehearse=rehearse)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def sync(self):
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(self, fn, reps: int = 1):
        """Best wall time of ``reps`` calls (synchronised) and the last result."""
        best, out = float("inf"), None
        for _ in range(reps):
            self.sync()
            t = time.perf_counter()
            out = fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
        return best, out

    def peak_mb(self):
        import torch

        return torch.cuda.max_memory_allocated() / 2 ** 20 if self.dev.type == "cuda" else None

    def reset_peak(self):
        import torch

        if self.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()


def fast_store(n: int, dim: int, *, tenants: int = 1, big_share: float = 0.5, seed: int = 0, device="cpu"):
    """A memory-like store built with array ops on ``device`` (1M nodes in about a second on a
    GPU): per tenant, embeddings drift through topics over time (a topic lasts ~12
    memories), timestamps an hour apart on average. Same idea as
    :func:`memforest_gpu.store.synthetic.synthetic_store`, without its per-node Python loop, and
    built straight into :class:`MemoryStore`'s documented fields (unique ids, unit float32
    rows, float64 times, one source per node) instead of through ``from_columns``, whose
    per-value validation takes longer than the benchmark itself at this size.
    Shape: -> MemoryStore, embeddings (n, dim)"""
    import numpy as np
    import torch

    from memforest_gpu.store.memory_store import MemoryStore

    dev = torch.device(device)
    rng = np.random.default_rng(seed)
    if tenants > 1:
        n_big = int(round(n * big_share))
        sizes = np.full(tenants - 1, (n - n_big) // (tenants - 1))
        sizes[: (n - n_big) - sizes.sum()] += 1
        sizes = np.concatenate([[n_big], sizes])
    else:
        sizes = np.array([n])
    g = torch.Generator(device=dev).manual_seed(seed)
    embs, ts, ten, ids = [], [], [], []
    for t, size in enumerate(sizes.tolist()):
        n_topics = max(1, size // 40)
        centres = torch.randn(n_topics, dim, generator=g, device=dev)
        seg = np.cumsum(rng.random(size) < 0.08)  # a new topic segment starts with probability 0.08
        topic = torch.from_numpy(rng.integers(0, n_topics, seg[-1] + 1)[seg]).to(dev)
        embs.append(centres[topic] + 0.35 * torch.randn(size, dim, generator=g, device=dev))  # (size, dim)
        ts.append(1.6e9 + np.cumsum(rng.exponential(3600.0, size)))
        ten += [f"tenant-{t}"] * size
        ids += [f"t{t}-{i}" for i in range(size)]
    emb = torch.nn.functional.normalize(torch.cat(embs), dim=1)  # (n, dim)
    return MemoryStore(ids=ids, texts=[f"Memory {i} of {t}." for i, t in zip(ids, ten)], embeddings=emb,
                       timestamps=torch.from_numpy(np.concatenate(ts)).to(dev, torch.float64), tenants=ten,
                       sources=[[i] for i in ids], metadata=[{} for _ in ids])



def frac_equal(a, b) -> float:
    """Fraction of equal entries of two same-shape tensors (on any devices)."""
    return float((a.cpu() == b.cpu()).float().mean()) if a.numel() else 1.0


def noisy_queries(store, Q: int, seed: int = 0):
    """``Q`` normalised noisy copies of random stored rows, on the store's device, and their tenants."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, len(store), (Q,), generator=g)
    noise = 0.3 * torch.randn(Q, store.dim, generator=g) / store.dim ** 0.5
    e = store.embeddings[rows.to(store.device)] + noise.to(store.device)  # (Q, D) noisy copies of stored rows
    return torch.nn.functional.normalize(e, dim=1), [store.tenants[i] for i in rows.tolist()]


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
