"""The compression flags shared by every command that compresses (``compress``, ``mem0
compress``, ``graph compress``, ``python -m memforest_gpu.distributed compress``): one
flag per config field, and the :class:`~memforest_gpu.config.CompressConfig` they build."""
from __future__ import annotations

import argparse
import re

__all__ = ["add_config_arguments", "config_from_args"]


def add_config_arguments(p: argparse.ArgumentParser, *, two_level: bool = True) -> None:
    """Add the flags of :func:`config_from_args` (defaults: the method's). ``two_level=False``
    leaves out ``--kmeans`` for commands that only run exact k-means."""
    p.add_argument("--ratio", type=float, default=0.5, help="fraction of each tenant's nodes to remove")
    p.add_argument("--schedule", default="sequential",
                   help="sequential (each tree merges its best pair per round) | matching (disjoint pairs per round)")
    p.add_argument("--seed", type=int, default=0, help="random seed (k-means++ seeding)")
    g = p.add_argument_group("event partition (k-means over meaning and time)")
    g.add_argument("--alpha", type=float, default=0.05, help="clusters per node (K = floor(alpha*N))")
    g.add_argument("--beta", type=float, default=0.8, help="semantic weight in the reassignment")
    g.add_argument("--window", type=int, default=5, help="temporal window, in positions")
    g.add_argument("--max-iter", type=int, default=30, help="at most this many Lloyd steps")
    if two_level:
        g.add_argument("--kmeans", default="exact",
                       help="exact | two-level (sub-quadratic: coarse cells, then k-means inside each; "
                            "for tenants of tens of thousands of nodes and more)")
    g = p.add_argument_group("trees and merge order")
    g.add_argument("--eta", type=float, default=0.99, help="similarity weight in the degree-adjusted score")
    g.add_argument("--degree-norm", default="none", help="none | max (the authors' code)")
    g.add_argument("--time-weight", type=float, default=0.0,
                   help="weight of local time on tree edges (0 = the paper: cosine only)")
    g.add_argument("--time-window", type=int, default=1, help="positions apart that count as neighbours on edges")
    g.add_argument("--size-weight", type=float, default=0.0,
                   help="penalty on the merged node's length, in units of the token cap (0 = the paper)")
    g.add_argument("--max-node-tokens", type=int, default=None,
                   help="cap on merged node length (default: the embedder's limit)")
    g.add_argument("--cap-policy", default="condense",
                   help="condense (a merge over the cap keeps its most informative sentences, so the ratio is "
                        "reached) | strict (pairs over the cap are not merged; the ratio may fall short)")


def config_from_args(a: argparse.Namespace):
    """The :class:`~memforest_gpu.config.CompressConfig` of parsed flags; a bad value raises
    ``ValueError`` naming the flag (``--degree-norm must be ...``)."""
    from .config import CompressConfig, MergeConfig, PartitionConfig, TreeConfig

    try:
        return CompressConfig(
            partition=PartitionConfig(alpha=a.alpha, beta=a.beta, window=a.window, max_iter=a.max_iter,
                                      seed=a.seed, kmeans=getattr(a, "kmeans", "exact")),
            tree=TreeConfig(eta=a.eta, degree_norm=a.degree_norm, time_weight=a.time_weight,
                            time_window=a.time_window, size_weight=a.size_weight),
            merge=MergeConfig(ratio=a.ratio, schedule=a.schedule, max_node_tokens=a.max_node_tokens, seed=a.seed,
                              cap_policy=getattr(a, "cap_policy", "condense")),
        )
    except ValueError as e:
        raise ValueError(as_flag_error(str(e), a)) from None


def as_flag_error(message: str, a: argparse.Namespace) -> str:
    """``"degree_norm must be ..."`` -> ``"--degree-norm must be ..."`` when the message starts
    with the name of one of the parsed options (the command line's words, not the API's)."""
    m = re.match(r"(\w+) must", message)
    if m and m.group(1) in vars(a):
        return "--" + m.group(1).replace("_", "-") + message[len(m.group(1)):]
    return message
