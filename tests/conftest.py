"""Shared test fixtures: the devices every kernel test runs on."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when it is imported (its own library functions are decorated then), and
    # any test may be the first to import it: without CUDA, the kernel tests need the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices)
def device(request):
    """Each device in ``devices`` (CUDA only when available)."""
    return request.param
