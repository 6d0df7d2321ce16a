"""memforest-gpu: GPU-accelerated MemForest compression of LLM-agent memory stores."""
__version__ = "0.1.0"
