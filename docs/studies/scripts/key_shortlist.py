"""What an approximate first pass would cost the keys' rule: each query's nodes shortlisted by
their text vector alone (the ``M`` best), then ranked by the exact rule (text blended with the
best key) inside the shortlist; AnsR@B retention (plain top-k) against the exact rule, on the
stores ``docs/studies/scripts/key_codes.py`` wrote (the preset's merges, int8 codes decoded as a reader does).

A search that scores only the text vectors first reads half the rows at ratio 0.5 (the
uncompressed store's speed x ~2) and then ``M`` nodes' keys per query; this measures whether
the nodes the keys bring back are inside such a shortlist.

    python docs/studies/scripts/key_shortlist.py --benchmark ../shared/data/locomo_dev5.json --cache CACHE \\
        --codes study_codes --shortlists 40,80,160,320
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts
from common import print_hardware  # noqa: E402
from key_codes import dec_int8  # noqa: E402
from merged_keys import Questions  # noqa: E402

from memforest_gpu.config import preset  # noqa: E402
from memforest_gpu.evaluation.bootstrap import cluster_bootstrap  # noqa: E402
from memforest_gpu.evaluation.cache import CachedEmbedder  # noqa: E402
from memforest_gpu.evaluation.locomo import load_locomo  # noqa: E402
from memforest_gpu.evaluation.metrics import NodeViews, score_ranked  # noqa: E402
from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder  # noqa: E402
from memforest_gpu.retrieval.keyed import node_best  # noqa: E402
from memforest_gpu.store.io import read_store  # noqa: E402
from memforest_gpu.store.merged_keys import derive_keys  # noqa: E402

K, C = 10, 40  # the protocol's k and the ranked list it cuts (L * k)


def blend(S: torch.Tensor, Sk: torch.Tensor, column: torch.Tensor, has: torch.Tensor, w: float) -> torch.Tensor:
    """The keys' rule from the text cosines and the keys' cosines: ``w S + (1 - w)`` the best key's
    cosine for a node with keys, ``S`` for the others.

    Shape: S (Q, n) text cosines, Sk (Q, m) key cosines, column (m,) each key's node, has (n,) bool -> (Q, n)
    """
    return torch.where(has, w * S + (1.0 - w) * node_best(Sk, column, S.shape[1]), S)


def ranked(store, keys, q: Questions, shortlist: int | None) -> np.ndarray:
    """Each question's C best nodes of its tenant by the rule, inside the text's ``shortlist``
    best (None: every node). Shape: -> (Q, C) store rows, -1 past the end"""
    out = np.full((len(q.tenants), C), -1, dtype=np.int64)
    codes = np.array([store.tenant_names().index(t) for t in q.tenants])
    text = dec_int8(store.embeddings)
    kv = dec_int8(keys.vectors)
    owner = torch.as_tensor(keys.owner)
    has = torch.as_tensor(keys.counts > 0)
    for t in np.unique(codes):
        rows = np.flatnonzero(store.tenant_codes_np == t)
        qi = np.flatnonzero(codes == t)
        Qe = q.emb[torch.as_tensor(qi)].float()
        S = Qe @ text[torch.as_tensor(rows)].T  # (Q_t, n) text cosines
        krow = np.flatnonzero(np.isin(keys.owner, rows))
        col = torch.as_tensor(np.searchsorted(rows, keys.owner[krow]))
        Sk = Qe @ kv[torch.as_tensor(krow)].T  # (Q_t, m)
        R = blend(S, Sk, col, has[torch.as_tensor(rows)], keys.text_weight)  # (Q_t, n) the exact rule
        if shortlist is not None and shortlist < len(rows):
            keep = torch.topk(S, shortlist, dim=1).indices
            R = torch.full_like(R, float("-inf")).scatter(1, keep, R.gather(1, keep))
        c = min(C, len(rows))
        v, j = torch.sort(R, dim=1, descending=True, stable=True)
        sel = np.where(torch.isfinite(v[:, :c]).numpy(), rows[j[:, :c].numpy()], -1)
        out[qi, :c] = sel
    del owner
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--codes", required=True, help="docs/studies/scripts/key_codes.py's --out (its stores)")
    ap.add_argument("--nodes", default="turns,facts")
    ap.add_argument("--ratios", default="0.5,0.7")
    ap.add_argument("--shortlists", default="40,80,160,320")
    a = ap.parse_args(argv)
    print_hardware()
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    w = preset("memforest").merge.text_weight
    for shape in a.nodes.split(","):
        bench = load_locomo(a.benchmark, nodes=shape)
        inp = bench.store(embedder, device="cpu")
        q = Questions(bench, embedder)
        originals = dict(zip(inp.ids, inp.texts))
        base = score_ranked(ranked(inp, derive_keys(inp, inp.sources.arrow, max_keys=None, text_weight=w), q, None),
                            NodeViews.build(inp, originals), q.answers, q.evidence, k=K, max_tokens=256)[("B", "ansr")]
        for ratio in [float(x) for x in a.ratios.split(",")]:
            out = read_store(os.path.join(a.codes, "stores", shape, f"memforest-matching_{ratio:g}.parquet"))
            keys = derive_keys(inp, out.sources.arrow, max_keys=None, text_weight=w)
            views = NodeViews.build(out, originals)
            exact = score_ranked(ranked(out, keys, q, None), views, q.answers, q.evidence, k=K,
                                 max_tokens=256)[("B", "ansr")]
            print(f"{shape} {ratio:g} exact rule: AnsR@B retention {100 * np.nanmean(exact) / np.nanmean(base):.1f}"
                  f" ({len(out)} nodes, {len(keys.vectors)} keys)", flush=True)
            for m in [int(x) for x in a.shortlists.split(",")]:
                sc = score_ranked(ranked(out, keys, q, m), views, q.answers, q.evidence, k=K,
                                  max_tokens=256)[("B", "ansr")]
                d = cluster_bootstrap(sc, exact, np.array(q.tenants))
                s = 100 / np.nanmean(base)
                print(f"{shape} {ratio:g} text shortlist {m:4d}: {100 * np.nanmean(sc) / np.nanmean(base):.1f} "
                      f"({d[0] * s:+.1f} [{d[1] * s:+.1f}, {d[2] * s:+.1f}] against the exact rule)", flush=True)


if __name__ == "__main__":
    main()
