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


@pytest.fixture(scope="session")
def mem0_servers(tmp_path_factory):
    """PostgreSQL + pgvector and Chroma's HTTP server for the Mem0 tests (tests/mem0_servers.py):
    each started on first use, both stopped when the session ends, failed tests or not."""
    from mem0_servers import Servers

    servers = Servers(str(tmp_path_factory.mktemp("mem0-servers")))
    try:
        yield servers
    finally:
        servers.stop()
