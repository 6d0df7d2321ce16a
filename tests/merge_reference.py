"""The merge-order reference now ships in the package, beside the fast path it checks
(:mod:`memforest_gpu.engine.reference`); this name stays only for bench/versus_reference.py,
which imports it by its old name, until that script imports the package's module."""
from memforest_gpu.engine.reference import reference_compress  # noqa: F401
