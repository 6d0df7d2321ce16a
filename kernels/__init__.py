"""Tensor kernels for MemForest, installed as ``memforest_gpu.kernels``.

Plain, device-agnostic PyTorch: every function follows the device and dtype of its
inputs, so the same code runs on CUDA and on CPU. Batched layouts are padded:
``(T, n, D)`` points with a ``(T, n)`` validity mask, one row per independent problem
(a tenant, or a tree), so many small problems run as one tensor op.
"""
from .agpr import agpr_rerank, dense_rank, topk_rows, topk_search
from .assign import best_match
from .edge_mst import edge_forest
from .knn import knn_blockwise, knn_cells, top_by_key
from .lloyd import cluster_centres, kmeans, lloyd_step
from .matching import best_edge_per_tree, greedy_matching
from .mst import spanning_forest, tree_degrees
from .padding import pack_segments, size_buckets, unpack_segments
from .rand import counter_uniform
from .reassign import reassign_to_centres
from .seeding import batched_d2_seeds, kmeans_plus_plus

__all__ = [
    "pack_segments", "unpack_segments", "size_buckets", "best_match", "kmeans", "batched_d2_seeds", "kmeans_plus_plus",
    "lloyd_step", "counter_uniform",
    "cluster_centres", "reassign_to_centres", "spanning_forest", "tree_degrees", "edge_forest",
    "knn_blockwise", "knn_cells", "top_by_key", "greedy_matching",
    "best_edge_per_tree", "agpr_rerank", "dense_rank", "topk_search", "topk_rows",
]
