"""Vector indexes for retrieval: exact torch search (default) or faiss (flat, IVF).

An index gives each query its ``C`` most similar rows of one tenant, best first; AGPR
then re-ranks those candidates exactly as with the torch search, so the choice of index
only changes how candidates are found, never how they are scored.

=============  =================================================================  =========
kind           what                                                               needs
=============  =================================================================  =========
torch          exact (Q, N) matmul + top-k on the store's device (the default)     -
faiss-flat     exact inner product, ``IndexFlatIP``                                faiss
faiss-ivf      inverted lists, ``IndexIVFFlat`` (inner product); ``nprobe`` lists  faiss
               per query; ``nprobe >= nlist`` searches every list (exact)
=============  =================================================================  =========

faiss runs on the GPU when the store is on CUDA and faiss-gpu sees a GPU (``gpu=None``),
else on the CPU. Tenants smaller than ``ivf_min_nodes`` get a flat index: inverted
lists over a few hundred vectors cost more than they save.

On the GPU (choices that follow faiss's documentation):

- one ``StandardGpuResources`` per device for the whole process, shared by every tenant's
  index (:func:`gpu_resources`): each such object reserves its own scratch memory (faiss
  ``StandardGpuResources.cpp``, ``getDefaultTempMemForGPU``: 512 MiB on GPUs of <= 4 GiB,
  1 GiB up to 8 GiB, 1.5 GiB above) and 256 MiB of pinned host memory, and "a single GPU
  resource object can be used by multiple indices, as long as they are not issuing
  concurrent queries" (faiss wiki, Running on GPUs). Searches through a shared object are
  therefore serialised by a per-device lock.
- queries go to ``index.search`` as torch tensors (``faiss.contrib.torch_utils``: "pytorch
  Tensors (CPU or GPU) ... as arguments to Faiss indexes", on PyTorch's current stream):
  a GPU index given device pointers on its own GPU makes no copies (faiss wiki, Faiss on
  the GPU), and the results come back as tensors on that device. No numpy, no host
  round-trip per search.

>>> r = IndexedRetriever(store, IndexConfig(kind="faiss-ivf", nprobe=16))
>>> r.search(query_embeddings, tenants="alice", config=RetrievalConfig(k=10, agpr=True))
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.agpr import topk_search
from ..store.memory_store import MemoryStore
from .keyed import node_row_table, rescore
from .retriever import Retriever

__all__ = ["IndexConfig", "INDEXES", "build_index", "default_nlist", "IndexedRetriever", "TorchIndex", "FaissIndex",
           "KeyedIndex", "gpu_resources"]

INDEXES = ("torch", "faiss-flat", "faiss-ivf")


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Which vector index finds retrieval candidates."""

    kind: str = "torch"  # one of INDEXES
    nlist: int | None = None  # IVF lists per tenant; None: round(4 * sqrt(N_t)), at most N_t // 39 (faiss's
    #                           minimum of 39 training points per list)
    nprobe: int = 8  # IVF lists searched per query; >= nlist is exact
    ivf_min_nodes: int = 1000  # tenants with fewer nodes get a flat index instead of IVF
    gpu: bool | None = None  # faiss on the GPU; None: when the vectors are on CUDA and faiss-gpu sees one

    def __post_init__(self):
        if self.kind not in INDEXES:
            raise ValueError(f"index must be one of {list(INDEXES)}, got {self.kind!r}")
        if self.nlist is not None and (isinstance(self.nlist, bool) or not isinstance(self.nlist, int)
                                       or self.nlist < 1):
            raise ValueError(f"nlist must be an integer >= 1 or None, got {self.nlist!r}")
        for name in ("nprobe", "ivf_min_nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


def default_nlist(n: int) -> int:
    """round(4 * sqrt(n)) inverted lists, at most n // 39 (faiss trains each on >= 39 points)."""
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def _import_faiss():
    try:
        import faiss
        import faiss.contrib.torch_utils  # noqa: F401 - index.search/add take torch tensors (CPU or GPU)
    except ImportError:
        raise ImportError("the faiss indexes need faiss: pip install faiss-cpu (or faiss-gpu), "
                          "or pip install 'memforest-gpu[faiss]'") from None
    return faiss


_GPU_RES: dict[int, tuple[object, threading.Lock]] = {}  # device -> (StandardGpuResources, search lock)
_GPU_RES_LOCK = threading.Lock()


def gpu_resources(device: int = 0):
    """The process's one ``faiss.StandardGpuResources`` for ``device`` and the lock that
    serialises searches through it (created on first use, then shared by every index)."""
    with _GPU_RES_LOCK:
        if device not in _GPU_RES:
            _GPU_RES[device] = (_import_faiss().StandardGpuResources(), threading.Lock())
        return _GPU_RES[device]


def _sort_candidates(sims: torch.Tensor, idx: torch.Tensor):
    """Best first with the torch path's tie rule (higher sim, then lower index); -1 last.

    Shape: (Q, C), (Q, C) -> (Q, C), (Q, C)
    """
    sims = torch.where(idx >= 0, sims, torch.full_like(sims, float("-inf")))
    key = torch.where(idx >= 0, idx, torch.full_like(idx, torch.iinfo(torch.int64).max))
    o1 = torch.argsort(key, dim=1, stable=True)
    o2 = torch.argsort(sims.gather(1, o1), dim=1, descending=True, stable=True)
    o = o1.gather(1, o2)
    return sims.gather(1, o), idx.gather(1, o)


class TorchIndex:
    """Exact search with :func:`memforest_gpu.kernels.topk_search`. Shape: X (N, D)"""

    kind = "torch"

    def __init__(self, X: torch.Tensor):
        self.X = X

    def search(self, Qe: torch.Tensor, c: int):
        """Shape: Qe (Q, D) -> sims (Q, c'), index (Q, c'), c' = min(c, N); -1 / -inf past the
        end"""
        return topk_search(Qe, self.X, c)


class FaissIndex:
    """A faiss inner-product index over one tenant's normalised vectors. Shape: X (N, D)"""

    def __init__(self, X: torch.Tensor, config: IndexConfig):
        faiss = _import_faiss()
        self.device = X.device
        N, D = X.shape
        xb = np.ascontiguousarray(X.detach().to("cpu", torch.float32).numpy())
        self.N = N
        self.nlist = 0
        if config.kind == "faiss-ivf" and config.ivf_min_nodes <= N:
            nlist = config.nlist if config.nlist is not None else default_nlist(N)
            self.nlist = max(1, min(nlist, N))
            quantizer = faiss.IndexFlatIP(D)
            index = faiss.IndexIVFFlat(quantizer, D, self.nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(xb)
            index.add(xb)
            index.nprobe = min(config.nprobe, self.nlist)
            self._quantizer = quantizer  # the IVF index does not own it
            self.kind = "faiss-ivf"
        else:
            index = faiss.IndexFlatIP(D)
            index.add(xb)
            self.kind = "faiss-flat"
        use_gpu = config.gpu
        if use_gpu is None:
            use_gpu = X.is_cuda and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
        if use_gpu:
            if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
                raise ValueError("gpu must be False or None when faiss sees no GPU (install faiss-gpu on a CUDA "
                                 f"machine), got gpu={config.gpu!r}")
            dev_id = X.device.index if X.is_cuda and X.device.index is not None else 0
            res, self._lock = gpu_resources(dev_id)
            index = faiss.index_cpu_to_gpu(res, dev_id, index)
            self.kind += "-gpu"
            # queries go to the index's own GPU as they are; a CPU store's queries are copied once
            self._qdev = torch.device("cuda", dev_id)
        else:
            self._lock, self._qdev = None, torch.device("cpu")
        self.index = index

    def search(self, Qe: torch.Tensor, c: int):
        """Shape: Qe (Q, D) -> sims (Q, c'), index (Q, c'), c' = min(c, N); -1 / -inf where
        fewer found

        Torch tensors in and out (``faiss.contrib.torch_utils``): on the GPU the index reads
        the queries where they are and writes its results there."""
        c = min(c, self.N)
        q = Qe.detach().to(self._qdev, torch.float32).contiguous()  # a no-op for a CUDA store's queries
        if self._lock is not None:
            with self._lock:  # one StandardGpuResources, shared: no concurrent queries through it
                D, idx = self.index.search(q, c)  # (Q, c) each, torch, on the index's device
        else:
            D, idx = self.index.search(q, c)
        return _sort_candidates(D.to(self.device), idx.to(self.device, torch.int64))


def build_index(X: torch.Tensor, config: IndexConfig | str = "torch"):
    """An index over the rows of ``X`` (one tenant). Shape: X (N, D) normalised"""
    cfg = IndexConfig(kind=config) if isinstance(config, str) else config
    if not isinstance(cfg, IndexConfig):
        raise ValueError(f"index must be one of {list(INDEXES)} or an IndexConfig, got {config!r}")
    if cfg.kind == "torch":
        return TorchIndex(X)
    return FaissIndex(X, cfg)


class KeyedIndex:
    """An index over one tenant whose nodes have keys: the index holds the tenant's rows (its
    segment of :class:`~.keyed.KeyedLayout`: a node with keys one blended row per key), finds the
    nodes owning the best rows, and scores each found node exactly, as its best row
    (:func:`~.keyed.rescore`). A node is found when one of its rows is among the ``c * kmax``
    best rows (an exact index finds the ``c`` best nodes so: each has at most ``kmax`` rows).

    Shape: A (R, D) rows, column (R,) the node of each row
    """

    def __init__(self, A: torch.Tensor, n: int, column: torch.Tensor, config: IndexConfig):
        self.A, self.n, self.node_of = A, n, column
        counts = np.bincount(column.cpu().numpy(), minlength=n)
        self.table = node_row_table(counts, A.device)  # (n, kmax) rows of each node
        self.inner = build_index(A, config)
        self.kind = self.inner.kind

    def search(self, Qe: torch.Tensor, c: int):
        """Shape: Qe (Q, D) -> sims (Q, c'), index (Q, c') node, c' = min(c, n); -1 / -inf past
        the end"""
        _, r = self.inner.search(Qe, c * self.table.shape[1])  # (Q, R') best rows
        nd = torch.where(r >= 0, self.node_of[r.clamp(min=0)], torch.full_like(r, -1))
        srt = torch.sort(nd, dim=1).values  # repeats of a node side by side
        dup = torch.zeros_like(srt, dtype=torch.bool)
        dup[:, 1:] = srt[:, 1:] == srt[:, :-1]
        cand = torch.where(dup, torch.full_like(srt, -1), srt)
        return rescore(Qe, cand, self.A, self.table, min(c, self.n))


class IndexedRetriever(Retriever):
    """:class:`~memforest_gpu.retrieval.retriever.Retriever` with a choice of vector index per
    tenant.
    With ``index="torch"`` it is ``Retriever`` (the batched exact search over the
    tenant-grouped rows; ``indexes`` stays empty); a faiss kind builds one index per tenant
    (``indexes``, by name) over a view of its segment, and a search runs one faiss call per
    queried tenant.

    >>> r = IndexedRetriever(store, "faiss-flat")
    >>> res = r.search(q, tenants=["alice"] * len(q), config=RetrievalConfig(k=10, agpr=True))
    """

    def __init__(self, store: MemoryStore, index: IndexConfig | str = "torch"):
        super().__init__(store)
        self.index_config = IndexConfig(kind=index) if isinstance(index, str) else index
        self.indexes = {}
        if self.index_config.kind != "torch":
            self.indexes = {t: self._build(j) for j, t in enumerate(self.tenants)}

    def _build(self, t: int):
        """Tenant ``t``'s index: over its text vectors, and its keys when its nodes have some."""
        lay = self._layout
        if lay is None or lay.plain[t]:
            return build_index(self.node_vectors(t), self.index_config)
        A, n, column = lay.segment(t)
        return KeyedIndex(A, n, column, self.index_config)

    def _candidates(self, codes: np.ndarray, queries: torch.Tensor, c: int):
        if self.index_config.kind == "torch":
            return super()._candidates(codes, queries, c)
        Q, dev = queries.shape[0], queries.device
        sims = torch.full((Q, c), float("-inf"), device=dev)
        pos = torch.full((Q, c), -1, dtype=torch.int64, device=dev)
        for t in np.unique(codes).tolist():
            qi = torch.as_tensor(np.flatnonzero(codes == t), dtype=torch.int64, device=dev)
            v, i = self.indexes[self.tenants[t]].search(queries[qi], c)  # (Q_t, c')
            s = int(self._start[t])
            sims[qi, :v.shape[1]] = v.to(sims.dtype)
            pos[qi, :v.shape[1]] = torch.where(i >= 0, i + s, i)
        return sims, pos
