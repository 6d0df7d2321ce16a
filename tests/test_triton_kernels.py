"""The Triton kernels agree with their PyTorch references (interpreter mode on CPU).

Every comparison is against the explicit ``backend="torch"`` path, never the kernel
against itself; the fallback of ``backend="auto"`` is recorded with its reason."""
import os

import pytest
import torch
from extras import need
from margins import assert_enough, best_match_margins, dot_tolerance

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel is first decorated

triton = need("triton")

from memforest_gpu.kernels import triton_assign  # noqa: E402
from memforest_gpu.kernels.assign import TIE_EPS, best_match  # noqa: E402
from memforest_gpu.kernels.triton_assign import best_match_triton, fallback_reasons, reset_fallbacks  # noqa: E402

DEVICES = ["cuda"] if torch.cuda.is_available() else []
if not DEVICES and os.environ.get("TRITON_INTERPRET") == "1":
    DEVICES = ["cpu"]
needs_kernel = pytest.mark.skipif(not DEVICES, reason="no CUDA and TRITON_INTERPRET=0")


def _torch(X, C, cv, mode="l2"):
    return best_match(X, C, cv, mode=mode, backend="torch")


def _assert_same_choice(i, i_ref, X, C, cv, mode, at_least=0.9):
    """Labels agree exactly wherever the best centre wins by more than the float32 rounding of
    either path (Triton's blocked dot products and torch's matmul round differently); exact
    duplicates of a centre score exactly the same in both and are ties broken by the lower
    index, so they are compared too. Both paths call scores within ``TIE_EPS`` of the best a
    tie, so a point is decided when its best beats every other distinct centre by more than
    ``TIE_EPS`` plus the rounding. Near-ties (none in these seeded cases, but possible on
    another BLAS) are left out; at least ``at_least`` of the points must be compared."""
    scale = 1.0 + float((C.double() ** 2).sum(-1).max()) \
        + float(X.double().norm(dim=-1).max() * C.double().norm(dim=-1).max())
    tol = dot_tolerance(X.shape[-1]) * scale
    gaps = best_match_margins(X, C, cv, mode, exact_ties=True)  # (T, n)
    ok = torch.from_numpy(gaps > tol + TIE_EPS).to(i.device)
    assert_enough(ok.flatten().cpu().numpy(), int(at_least * ok.numel()), "points")
    torch.testing.assert_close(i[ok], i_ref[ok], rtol=0, atol=0)


@needs_kernel
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
    v_ref, i_ref = _torch(X, C, c_valid, mode)
    v, i = best_match_triton(X, C, c_valid, mode=mode, block_n=16, block_k=16, block_d=16)
    _assert_same_choice(i, i_ref, X, C, c_valid, mode)
    torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)  # the best score is continuous: everywhere
    v2, i2 = best_match(X, C, c_valid, mode=mode, backend="triton")  # the public entry, default blocks
    _assert_same_choice(i2, i_ref, X, C, c_valid, mode)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_best_match_triton_all_invalid_row(device):
    X = torch.nn.functional.normalize(torch.randn(2, 5, 4), dim=-1).to(device)
    C = torch.randn(2, 3, 4).to(device)
    c_valid = torch.tensor([[False, False, False], [True, False, True]], device=device)
    v, i = best_match_triton(X, C, c_valid, block_n=16, block_k=16, block_d=16)
    assert (i[0] == -1).all() and torch.isinf(v[0]).all()
    v_ref, i_ref = _torch(X, C, c_valid)
    torch.testing.assert_close(i, i_ref, rtol=0, atol=0)


@needs_kernel
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
    _, i_ref = _torch(X, C, cv, "dot")
    _, i = best_match_triton(X, C, cv, mode="dot", block_n=16, block_k=16, block_d=16)
    assert (i_ref[0, :10] == 2).all() and (i[0, :10] == 2).all()
    _assert_same_choice(i, i_ref, X, C, cv, "dot")


def test_kernel_is_a_module_level_function_using_module_level_tl():
    """Triton resolves ``tl`` from the kernel function's globals (older releases do not look
    into closures): the kernel must be defined at module level, where ``tl`` is imported."""
    fn = triton_assign._best_match_kernel
    assert fn.__closure__ is None and fn.__qualname__ == "_best_match_kernel"
    assert fn.__globals__["tl"] is triton.language


# --------------------------------------------------------------------------- fallback record
@pytest.fixture
def fresh():
    reset_fallbacks()
    yield
    reset_fallbacks()


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.nn.functional.normalize(torch.randn(2, 30, 8, generator=g), dim=-1)
    C = torch.randn(2, 7, 8, generator=g)
    return X, C, torch.ones(2, 7, dtype=torch.bool)


def test_auto_on_cpu_is_the_torch_path_without_a_record(fresh):
    X, C, cv = _case()
    v, i = best_match(X, C, cv)
    v_ref, i_ref = _torch(X, C, cv)
    assert torch.equal(i, i_ref) and torch.equal(v, v_ref)
    assert fallback_reasons() == {}


def test_a_failing_kernel_is_recorded_with_its_reason_and_not_retried(fresh, monkeypatch):
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise RuntimeError("ptxas: out of registers")

    monkeypatch.setattr(triton_assign, "_kernel_expected", lambda X: True)  # as on CUDA
    monkeypatch.setattr(triton_assign, "best_match_triton", broken)
    monkeypatch.delenv("MEMFOREST_TRITON", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # so the device check passes on a CPU
    X, C, cv = _case(1)
    for _ in range(3):
        v, i = best_match(X, C, cv)
        v_ref, i_ref = _torch(X, C, cv)
        assert torch.equal(i, i_ref) and torch.equal(v, v_ref)
    (reason, count), = fallback_reasons().items()
    assert "RuntimeError: ptxas: out of registers" in reason and count == 3
    assert len(calls) == 1  # a kernel that failed there is not rebuilt on every call
    reset_fallbacks()
    best_match(X, C, cv)
    assert len(calls) == 2  # ... until the record is reset


def test_kernel_switched_off_or_missing_is_recorded(fresh, monkeypatch):
    monkeypatch.setattr(triton_assign, "_kernel_expected", lambda X: True)
    X, C, cv = _case(2)
    monkeypatch.setenv("MEMFOREST_TRITON", "0")
    best_match(X, C, cv)
    assert fallback_reasons() == {"MEMFOREST_TRITON=0": 1}
    monkeypatch.delenv("MEMFOREST_TRITON")
    monkeypatch.setattr(triton_assign, "triton", None)
    _, i = best_match(X, C, cv)
    assert torch.equal(i, _torch(X, C, cv)[1])
    assert fallback_reasons()["triton is not installed (pip install 'memforest-gpu[triton]')"] == 1
    with pytest.raises(ImportError, match="needs triton"):
        best_match(X, C, cv, backend="triton")  # an explicit request never falls back


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.mem_get_info()[0] < 14 * 2 ** 30,
                    reason="needs CUDA with 14 GiB free")
def test_best_match_triton_past_2_31_elements():
    """n x D > 2**31: the rows past the int32 range get the same centres as the PyTorch path."""
    D, K = 384, 24
    n = (2 ** 31) // D + 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.randn(1, n, D, device="cuda", generator=g)
    C = torch.randn(1, K, D, device="cuda", generator=g)
    cv = torch.ones(1, K, dtype=torch.bool, device="cuda")
    _, i = best_match_triton(X, C, cv, mode="dot")
    tail = slice(n - 8192, n)  # rows whose offsets row * D pass 2**31
    _, i_ref = _torch(X[:, tail].contiguous(), C, cv, "dot")
    torch.testing.assert_close(i[:, tail], i_ref, rtol=0, atol=0)
    _, i_head = _torch(X[:, :8192].contiguous(), C, cv, "dot")
    torch.testing.assert_close(i[:, :8192], i_head, rtol=0, atol=0)
