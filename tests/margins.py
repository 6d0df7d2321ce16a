"""Margins: how far an input is from the near-ties where two numerical paths may disagree.

A top-k, an AGPR candidate pool, a best-centre search or a merge order is a discontinuous
function of its inputs: where two values lie closer than the rounding of the paths that
compute them, either answer is right, and which one a path returns depends on its BLAS, its
thread count and its blocking (the faiss flat index and torch's matmul differ there, as do
MKL's AVX2 and SSE kernels). A test that holds two such paths to the same discrete answer is
only meaningful where the answer is decided by more than that rounding, so the tests here

- compute the deciding gaps in float64 (:func:`sorted_gaps`, :func:`retrieval_margins`,
  :func:`best_match_margins`),
- compare the discrete output exactly where the margin exceeds :func:`dot_tolerance` and
  assert that enough inputs do (so the comparison is never vacuous),
- compare the continuous part everywhere (the sorted similarity values of a top-k are
  continuous even where the order is not) within the same tolerance.

The tolerance is the worst-case rounding of a float32 dot product of unit vectors,
``gamma_D = D u / (1 - D u)`` with ``u = 2**-24``, for each of two paths, plus the
normalisation of the query: it depends on the dimension, never on the machine.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["dot_tolerance", "sorted_gaps", "retrieval_margins", "best_match_margins", "assert_enough"]

U32 = 2.0 ** -24  # unit roundoff of float32


def dot_tolerance(dim: int, *, paths: int = 2, slack: float = 2.0) -> float:
    """Largest difference two float32 paths may show on a dot product of unit vectors of
    ``dim`` components (each within ``gamma_D``, plus ``4u`` for normalising), times ``slack``."""
    g = dim * U32 / (1.0 - dim * U32)
    return slack * paths * (g + 4 * U32)


def sorted_gaps(values: np.ndarray, upto: int, *, exact_ties: bool = False) -> np.ndarray:
    """Per row, the smallest gap between consecutive values among its ``upto + 1`` largest
    (the order of the first ``upto`` and the cut after them); +inf where a row has fewer.
    -inf entries (invalid) count as absent. ``exact_ties``: equal values are ties by
    construction (computed the same way by every path, broken by a later key), not near-ties.

    Shape: values (Q, N) -> (Q,) float64
    """
    v = -np.sort(-np.asarray(values, dtype=np.float64), axis=1)[:, : upto + 1]
    gaps = v[:, :-1] - v[:, 1:]
    gaps = np.where(np.isfinite(gaps), gaps, np.inf)  # a gap to an absent (-inf) value decides nothing
    if exact_ties:
        gaps = np.where(gaps == 0, np.inf, gaps)
    return gaps.min(axis=1) if gaps.shape[1] else np.full(len(v), np.inf)


def retrieval_margins(embeddings: torch.Tensor, timestamps: torch.Tensor, rows_of_query: list[np.ndarray],
                      queries: torch.Tensor, *, k: int, agpr: bool = False, L: int = 4, lam: float = 0.2,
                      gamma: float = 0.9) -> np.ndarray:
    """The smallest gap that decides each query's result, computed in float64.

    Plain top-k: the gaps among the ``k + 1`` best similarities (the order of the top k and
    the cut). AGPR: the gaps among the ``L k + 1`` best similarities (the pool, its anchors
    and its order) and among the ``k + 1`` best final scores ``v`` of that pool; with
    ``gamma = 0`` the scores are the propagation term alone, whose equal values are exact
    ties (the same dense ranks give the same sum in every path), broken by the similarity.

    Shape: embeddings (N, D), timestamps (N,), rows_of_query: Q arrays of the rows each query
    may see, queries (Q, D) -> (Q,) float64
    """
    from memforest_gpu.kernels.agpr import agpr_rerank

    X = embeddings.detach().cpu().double()
    ts = timestamps.detach().cpu().double()
    Qd = torch.nn.functional.normalize(queries.detach().cpu().double(), dim=1)
    out = np.empty(len(Qd))
    for q, rows in enumerate(rows_of_query):
        rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        s = (X[rows] @ Qd[q]).numpy()[None]  # (1, n)
        C = L * k if agpr else k
        m = sorted_gaps(s, C)[0]
        if agpr:
            top = np.argsort(-s[0], kind="stable")[:C]
            sims = torch.from_numpy(s[0, top])[None]
            _, v = agpr_rerank(sims, ts[rows[top]][None], torch.ones_like(sims, dtype=torch.bool), k, lam=lam,
                               gamma=gamma)
            m = min(m, float(sorted_gaps(v.numpy(), k, exact_ties=gamma == 0)[0]))
        out[q] = m
    return out


def best_match_margins(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, mode: str = "dot", *,
                       exact_ties: bool = False) -> np.ndarray:
    """Per point, the float64 gap between its best and second-best valid centre's score
    (``dot``: x.c; ``l2``: 2 x.c - c.c, the score the kernel ranks by). ``exact_ties``:
    bitwise-equal centres score exactly the same in every path (a tie broken by the index),
    so their zero gap is skipped and the next distinct score decides.

    Shape: X (T, n, D), C (T, K, D), c_valid (T, K) -> (T, n) float64
    """
    Xd, Cd = X.detach().cpu().double(), C.detach().cpu().double()
    S = Xd @ Cd.transpose(1, 2)  # (T, n, K)
    if mode == "l2":
        S = 2 * S - (Cd * Cd).sum(-1)[:, None, :]
    S = S.masked_fill(~c_valid.cpu()[:, None, :], float("-inf")).numpy()
    T, n, K = S.shape
    flat = S.reshape(T * n, K)
    if not exact_ties:
        return sorted_gaps(flat, 1).reshape(T, n)
    top = -np.sort(-flat, axis=1)
    second = np.array([r[r < r[0]][0] if np.isfinite(r[0]) and (r < r[0]).any() else -np.inf for r in top])
    gap = top[:, 0] - second
    return np.where(np.isfinite(gap), gap, np.inf).reshape(T, n)


def assert_enough(ok: np.ndarray, at_least: int, what: str) -> None:
    """The separated inputs a test compares exactly must not be a handful: say how many."""
    n = int(np.asarray(ok).sum())
    assert n >= at_least, f"only {n} of {len(ok)} {what} are separated by more than the rounding (need {at_least})"
