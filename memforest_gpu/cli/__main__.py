"""``python -m memforest_gpu.cli ...``: the ``memforest`` command."""
import sys

from .commands import main

sys.exit(main())
