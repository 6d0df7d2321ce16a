"""``torchrun --nproc-per-node N -m memforest_gpu.distributed compress IN OUT [options]``

Without torchrun (``python -m memforest_gpu.distributed compress ...``) it runs as one rank.
The command line is :mod:`memforest_gpu.cli.distributed`; this entry point hands it
:func:`~.launch.run_ranks`, which runs this process as one rank.
"""
from __future__ import annotations

import sys

from ..cli.distributed import build_parser
from ..cli.distributed import main as command
from .launch import run_ranks

__all__ = ["main", "build_parser"]


def main(argv: list[str] | None = None) -> int:
    return command(argv, run_ranks=run_ranks)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
