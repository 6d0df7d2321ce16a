"""A two-stage keyed search, measured against the exact rule (a study; nothing of it ships).

Stage 1: per tenant, one product of its queries with its nodes' text vectors and each query's
``M`` best nodes. Stage 2: those nodes' keys gathered into one (Q_t, L, D) block per tenant, one
batched product, each node's best key by ``scatter_reduce``, the rule's top c. Compared in one
run, interleaved, with the uncompressed store, the compressed store's exact rule and its text
alone (:class:`~memforest_gpu.retrieval.retriever.Retriever`); prints queries/s and the share of
the exact rule's top 10 that the two-stage search finds (docs/studies/search-speed.md).

    python docs/studies/scripts/shortlist_speed.py --nodes 50000 --tenants 50 --shortlists 20,40
    # or --input IN --output OUT
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts
from common import print_hardware  # noqa: E402
from search_speed import _timed, random_queries, stores  # noqa: E402

from memforest_gpu import RetrievalConfig, Retriever  # noqa: E402


class TwoStage:
    """The two-stage search over a keyed store's grouped layout (a :class:`Retriever`'s)."""

    def __init__(self, r: Retriever):
        keys = r.store.keys
        self.r = r
        self.codes = keys.vectors  # (M, D) float32 or int8 codes
        self.inv = 1.0 / self.codes.float().norm(dim=1)  # (M,) a code row's scale
        rows = r._rows.cpu().numpy()
        cnt = np.diff(keys.offsets)
        self.count = torch.as_tensor(cnt[rows])  # (N,) keys per grouped node
        self.first = torch.as_tensor(keys.offsets[:-1][rows])  # (N,) its first key row
        self.X = r.store.embeddings[r._rows].float()  # (N, D) grouped text vectors
        self.w = keys.text_weight

    def candidates(self, q: torch.Tensor, tenants: list[str], c: int, m: int):
        """Shape: q (Q, D) -> sims (Q, c), pos (Q, c) grouped node position"""
        codes = self.r._resolve_tenants(tenants, len(q))
        order = np.argsort(codes, kind="stable")
        sims = torch.full((len(q), c), float("-inf"))
        pos = torch.full((len(q), c), -1, dtype=torch.int64)
        ts, first = np.unique(codes[order], return_index=True)
        bounds = np.append(first, len(q))
        for j, t in enumerate(ts.tolist()):
            qi = torch.as_tensor(order[bounds[j]:bounds[j + 1]])
            v, p = self._tenant(q[qi], *self.r._segment(t), c, m)
            sims[qi, :v.shape[1]], pos[qi, :v.shape[1]] = v, p
        return sims, pos

    def _tenant(self, qq: torch.Tensor, s: int, e: int, c: int, m: int):
        sv, si = torch.topk(qq @ self.X[s:e].T, min(m, e - s), dim=1)  # (Qt, m) text stage
        node = si + s
        kc = self.count[node]  # (Qt, m)
        end = torch.cumsum(kc, 1)
        tot = end[:, -1]
        L = int(tot.max())
        score = sv
        if L:
            col = torch.arange(L)
            slot = torch.searchsorted(end, col.expand(len(qq), L).contiguous(), right=True).clamp(max=node.shape[1] - 1)
            ok = col[None, :] < tot[:, None]
            within = col[None, :] - (end - kc).gather(1, slot)
            krow = torch.where(ok, self.first[node].gather(1, slot) + within, torch.zeros_like(within))
            G = self.codes[krow.reshape(-1)].view(len(qq), L, -1).float()  # (Qt, L, D)
            dots = (torch.bmm(G, qq[:, :, None])[:, :, 0] * self.inv[krow]).masked_fill(~ok, float("-inf"))
            best = torch.full_like(sv, float("-inf")).scatter_reduce(1, slot, dots, "amax", include_self=True)
            score = torch.where(self.count[node] > 0, self.w * sv + (1 - self.w) * best, sv)
        v, o = torch.topk(score, min(c, node.shape[1]), dim=1)
        return v, node.gather(1, o)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", help="an uncompressed store (with --output: its compression); default synthetic")
    ap.add_argument("--output")
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--shortlists", default="20,40")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    print_hardware()
    inp, out = stores(a)  # the stores and queries of bench/search_speed.py
    text = dataclasses.replace(out)
    text.keys = None
    ten, q = random_queries(inp, a.queries)
    ru, rc, rt = Retriever(inp), Retriever(out), Retriever(text)
    two = TwoStage(rc)
    ms = [int(x) for x in a.shortlists.split(",")]
    for agpr in (False, True):
        cfg = RetrievalConfig(k=10, agpr=agpr)
        c = cfg.L * cfg.k if agpr else cfg.k
        runs = {"uncompressed": lambda: ru.search(q, tenants=ten, config=cfg),
                "exact rule": lambda: rc.search(q, tenants=ten, config=cfg),
                "text alone": lambda: rt.search(q, tenants=ten, config=cfg)}
        runs.update({f"two-stage M={m}": (lambda m=m: two.candidates(q, ten, c, max(c, m))) for m in ms})
        best = {}
        for _ in range(a.repeat):
            for name, f in runs.items():
                best[name] = min(best.get(name, float("inf")), _timed(f))
        print("agpr" if agpr else "top-k", {n: f"{a.queries / t:.0f} q/s ({best['uncompressed'] / t:.2f}x)"
                                            for n, t in best.items()})
    codes = rc._resolve_tenants(ten, a.queries)
    _, exact = rc._candidates(codes, q, 10)
    for m in ms:
        _, got = two.candidates(q, ten, 10, m)
        agree = np.mean([len(set(x) & set(y)) / 10 for x, y in zip(exact.tolist(), got.tolist())])
        print(f"M={m}: {agree:.4f} of the exact rule's top 10 found")


if __name__ == "__main__":
    main()
