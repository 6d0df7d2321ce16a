"""Tensor kernels for MemForest, installed as ``memforest_gpu.kernels``.

Plain, device-agnostic PyTorch: every function follows the device and dtype of its
inputs, so the same code runs on CUDA and on CPU. Batched layouts are padded:
``(T, n, D)`` points with a ``(T, n)`` validity mask, one row per independent problem
(a tenant, or a tree), so many small problems run as one tensor op.
"""
from .padding import pack_segments, unpack_segments, size_buckets
from .assign import best_match
from .kmeans import kmeans, lloyd_step, cluster_centres
from .seeding import batched_d2_seeds, kmeans_plus_plus
from .rand import counter_uniform
from .reassign import reassign_to_centres
from .mst import spanning_forest, tree_degrees
from .forest import edge_forest
from .knn import knn_blockwise, knn_cells, top_by_key
from .matching import greedy_matching, best_edge_per_tree
from .agpr import agpr_rerank, dense_rank, topk_rows, topk_search

__all__ = [
    "pack_segments", "unpack_segments", "size_buckets", "best_match", "kmeans", "batched_d2_seeds", "kmeans_plus_plus",
    "lloyd_step", "counter_uniform",
    "cluster_centres", "reassign_to_centres", "spanning_forest", "tree_degrees", "edge_forest",
    "knn_blockwise", "knn_cells", "top_by_key", "greedy_matching",
    "best_edge_per_tree", "agpr_rerank", "dense_rank", "topk_search", "topk_rows",
]
