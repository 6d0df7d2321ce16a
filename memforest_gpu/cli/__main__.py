"""``python -m memforest_gpu.cli ...``: the ``memforest`` command."""
import sys

from .main import main

sys.exit(main())
