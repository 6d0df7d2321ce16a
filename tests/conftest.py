"""Shared test fixtures: the devices every kernel test runs on."""
import pytest
import torch

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices)
def device(request):
    """Each device in ``devices`` (CUDA only when available)."""
    return request.param
