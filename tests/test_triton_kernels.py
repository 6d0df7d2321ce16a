"""The Triton kernels agree with their PyTorch references (interpreter mode on CPU)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel is first built

triton = pytest.importorskip("triton")

from memforest_gpu.kernels import best_match  # noqa: E402
from memforest_gpu.kernels.triton_assign import best_match_triton  # noqa: E402

DEVICES = ["cuda"] if torch.cuda.is_available() else []
if not DEVICES:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and TRITON_INTERPRET=0", allow_module_level=True)
    DEVICES = ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,n,K,D", [(1, 1, 1, 3), (2, 37, 5, 17), (3, 65, 70, 33), (1, 130, 129, 8)])
@pytest.mark.parametrize("mode", ["l2", "dot"])
def test_best_match_triton_matches_reference(device, T, n, K, D, mode):
    g = torch.Generator().manual_seed(T * 1000 + n + K + D)
    X = torch.nn.functional.normalize(torch.randn(T, n, D, generator=g), dim=-1).to(device)
    C = torch.randn(T, K, D, generator=g).to(device)
    c_valid = (torch.rand(T, K, generator=g) > 0.2).to(device)
    c_valid[:, 0] = True
    if K > 3:  # exact duplicate centres: ties must go to the lower index
        C[:, 3] = C[:, 1]
        c_valid[:, 1] = c_valid[:, 3] = True
    v_ref, i_ref = best_match(X, C, c_valid, mode=mode)
    v, i = best_match_triton(X, C, c_valid, mode=mode, block_n=16, block_k=16, block_d=16)
    torch.testing.assert_close(i, i_ref, rtol=0, atol=0)
    torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_best_match_triton_all_invalid_row(device):
    X = torch.nn.functional.normalize(torch.randn(2, 5, 4), dim=-1).to(device)
    C = torch.randn(2, 3, 4).to(device)
    c_valid = torch.tensor([[False, False, False], [True, False, True]], device=device)
    v, i = best_match_triton(X, C, c_valid, block_n=16, block_k=16, block_d=16)
    assert (i[0] == -1).all() and torch.isinf(v[0]).all()
    v_ref, i_ref = best_match(X, C, c_valid)
    torch.testing.assert_close(i, i_ref, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_best_match_triton_duplicate_centres_in_other_tiles(device):
    """Identical centres in different K tiles: both paths pick the lowest index."""
    g = torch.Generator().manual_seed(5)
    X = torch.nn.functional.normalize(torch.randn(1, 40, 64, generator=g), dim=-1).to(device)
    C = torch.nn.functional.normalize(torch.randn(1, 50, 64, generator=g), dim=-1).to(device)
    C[:, 40] = C[:, 2]
    C[:, 20] = C[:, 2]
    X[:, :10] = C[:, 2]  # these points sit exactly on the triplicated centre
    cv = torch.ones(1, 50, dtype=torch.bool, device=device)
    _, i_ref = best_match(X, C, cv, mode="dot")
    _, i = best_match_triton(X, C, cv, mode="dot", block_n=16, block_k=16, block_d=16)
    assert (i_ref[0, :10] == 2).all()
    torch.testing.assert_close(i, i_ref, rtol=0, atol=0)
