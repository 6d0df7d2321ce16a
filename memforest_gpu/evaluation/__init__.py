"""Measuring compression quality offline (docs/evaluation.md): benchmarks, baselines, metrics,
the grid
(the command ``memforest eval`` is :mod:`memforest_gpu.cli.eval`).

>>> from memforest_gpu.evaluation import load_benchmark, run_grid, CachedEmbedder, write_outputs
>>> bench = load_benchmark("../shared/data/locomo_dev5.json")
>>> res = run_grid(bench, ["tome", "memforest"], [0.5], [0], embedder=CachedEmbedder(emb,
...     "out/.cache"))
>>> write_outputs(res, "out")
"""
from .benchmark import load_benchmark, write_benchmark
from .cache import CachedEmbedder
from .dataset import Benchmark, Question
from .harness import EvalConfig, EvalResult, run_grid
from .locomo import clean_evidence, load_locomo
from .methods import ABLATIONS, DEFAULT_METHODS, MethodSpec, compress_with, parse_method
from .result_files import paired_bootstrap, write_outputs

__all__ = [
    "Benchmark", "Question", "load_benchmark", "write_benchmark", "load_locomo", "clean_evidence",
    "CachedEmbedder", "EvalConfig", "EvalResult", "run_grid", "compress_with", "parse_method", "MethodSpec",
    "ABLATIONS", "DEFAULT_METHODS", "paired_bootstrap", "write_outputs",
]
