"""Shared helpers of the kernel tests (tests/test_kernels_*.py): tensor <-> numpy, the sizes
every kernel is checked at, a fixture that pins one CPU thread for a test module, and the
plain Kruskal reference (also used by tests/test_engine.py).

References are plain Python / numpy loops (and networkx for spanning trees) written from
docs/method.md sections 1, 2 and 4, not from the kernels. Integer outputs are compared exactly.
Inputs that must tie are built so the ties are exact in floating point (integer-valued
vectors, multiples of 1/4, duplicated rows), which lets tie rules be checked exactly;
continuous inputs are checked with the tolerances stated at each assertion.

Every test runs on each device of ``devices`` (tests/conftest.py; CUDA when available).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

SIZES = [1, 2, 3, 7, 31, 100]


@pytest.fixture(scope="module", autouse=True)
def _one_cpu_thread():
    """The tensors here are tiny: CPU intra-op threads only add synchronisation, which costs
    seconds on a loaded 2-core machine. Restored after the module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def T(a, device, dtype=None):
    return torch.as_tensor(np.asarray(a), device=device, dtype=dtype)


def N(t):
    return t.detach().cpu().numpy()


def kruskal_ref(W: np.ndarray, active: np.ndarray, maximum: bool = True) -> set:
    """Plain Kruskal with the method's explicit order: weight desc (asc for minimum), then (i, j) asc
    (the union-find of :func:`memforest_gpu.engine.reference.kruskal`, on every pair of active vertices)."""
    from memforest_gpu.engine.reference import kruskal

    act = [i for i in range(W.shape[0]) if active[i]]
    sign = 1.0 if maximum else -1.0
    edges = [(sign * float(W[i, j]), i, j) for a, i in enumerate(act) for j in act[a + 1:]]
    return {(i, j) for i, j, _ in kruskal(W.shape[0], edges)}
