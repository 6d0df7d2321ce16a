"""What a merged node's vectors cost: every encoding of the text vectors and keys scored on
ONE set of compressed stores, side by side (retention, bytes, search queries/s).

Each (shape, ratio) is compressed once with the ``--preset`` and its keys made by the shipped
code (every source, or ``k`` centres); then every encoding re-scores the same store. An encoding
turns the stored vectors into what a reader decodes (a search always ranks by the decoded
vectors, normalised on load):

- ``f32``: float32 text vectors and keys (the store as written before int8 codes);
- ``f16``: float16 for both;
- ``t32-k8``: float32 text vectors, int8 keys (a per-vector scale; cosines do not need it);
- ``i8``: int8 text vectors and keys;
- ``i8-k{K}``: int8, at most ``K`` keys per node (``K`` centres of its sources);
- ``i8-bin``: int8 text vectors, keys as sign bits (1 bit per dimension);
- ``i8-pq{M}``: int8 text vectors, keys product-quantised (faiss, ``M`` bytes per key, 8-bit
  codebooks of 256 centroids, whose floats are counted);
- ``i8-text``: int8 text vectors, no keys (what a one-vector store holds).

Bytes: UTF-8 text, vectors as encoded, keys as encoded plus their source ids (UTF-8), against
the uncompressed store's text and float32 vectors. Queries/s: every question of the shape,
searched (plain top-k, k = 10) over the decoded store with the shipped retriever, best of 3.
Retention: AnsR@B (plain and AGPR) against the uncompressed store, with a cluster bootstrap
(conversations, then questions; 2,000 resamples) of each encoding's difference from ``f32``.

    python docs/studies/scripts/key_codes.py --benchmark ../shared/data/locomo_dev5.json --nodes turns,facts \\
        --ratios 0.3,0.5,0.7 --cache CACHE --out study_codes
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from common import print_hardware  # noqa: E402
from merged_keys import KEPT, Questions, rankings  # noqa: E402

from memforest_gpu.config import RetrievalConfig, preset  # noqa: E402
from memforest_gpu.evaluation.bootstrap import cluster_bootstrap  # noqa: E402
from memforest_gpu.evaluation.cache import CachedEmbedder  # noqa: E402
from memforest_gpu.evaluation.locomo import load_locomo  # noqa: E402
from memforest_gpu.evaluation.methods import compress_with, parse_method  # noqa: E402
from memforest_gpu.evaluation.metrics import NodeViews, score_ranked  # noqa: E402
from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder  # noqa: E402
from memforest_gpu.mergers.extractive import ExtractiveMerger  # noqa: E402
from memforest_gpu.retrieval.retriever import Retriever  # noqa: E402
from memforest_gpu.store.codes import int8_codes  # noqa: E402
from memforest_gpu.store.io import read_store, write_store  # noqa: E402
from memforest_gpu.store.keys import NodeKeys  # noqa: E402
from memforest_gpu.store.merged_keys import derive_keys  # noqa: E402

K = 10


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=1)


def dec_int8(x: torch.Tensor) -> torch.Tensor:
    return unit(torch.from_numpy(int8_codes(x).astype(np.float32)))


def dec_f16(x: torch.Tensor) -> torch.Tensor:
    return unit(x.half().float())


def dec_bin(x: torch.Tensor) -> torch.Tensor:
    return unit(torch.where(x >= 0, 1.0, -1.0))


def dec_pq(x: torch.Tensor, m: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """Keys through faiss's product quantiser (m sub-vectors, 8 bits each); (decoded, codebook bytes)."""
    import faiss
    xs = np.ascontiguousarray(x.float().numpy())
    pq = faiss.ProductQuantizer(xs.shape[1], m, 8)
    pq.cp.seed = seed
    pq.train(xs)
    return unit(torch.from_numpy(pq.decode(pq.compute_codes(xs)))), int(pq.centroids.size()) * 4


ENCODINGS = ("f32", "f16", "t32-k8", "i8", "i8-k2", "i8-k3", "i8-bin", "i8-pq48", "i8-pq24", "i8-text")


def encode(name: str, emb: torch.Tensor, keys: dict, D: int) -> tuple[torch.Tensor, NodeKeys | None, dict]:
    """(decoded text vectors, decoded keys, bytes of vectors and of keys) of one encoding.
    ``keys``: bound -> NodeKeys (every source: None)."""
    if name in ("f32", "t32-k8"):
        text_dec, text_b = unit(emb), 4 * D
    elif name == "f16":
        text_dec, text_b = dec_f16(emb), 2 * D
    else:
        text_dec, text_b = dec_int8(emb), D
    n = emb.shape[0]
    bound = 2 if name == "i8-k2" else 3 if name == "i8-k3" else None
    if name == "i8-text":
        return text_dec, None, {"vectors": n * text_b, "keys": 0, "key_ids": 0, "codebook": 0, "key_rows": 0}
    base = keys[bound]
    kv = base.vectors
    codebook = 0
    if name == "f32":
        kd, kb = unit(kv), 4 * D
    elif name == "f16":
        kd, kb = dec_f16(kv), 2 * D
    elif name in ("t32-k8", "i8", "i8-k2", "i8-k3"):
        kd, kb = dec_int8(kv), D
    elif name == "i8-bin":
        kd, kb = dec_bin(kv), D // 8
    else:
        m = int(name.split("pq")[1])
        kd, codebook = dec_pq(kv, m)
        kb = m
    ids = sum(len(s.encode("utf-8")) for lst in base.sources.to_pylist() for s in lst)
    k = NodeKeys(kd, base.offsets, base.sources, base.text_weight, base.max_keys)
    return text_dec, k, {"vectors": n * text_b, "keys": kv.shape[0] * kb, "key_ids": ids, "codebook": codebook,
                         "key_rows": int(kv.shape[0])}


def qps(r: Retriever, q: Questions, reps: int = 3) -> float:
    cfg = RetrievalConfig(k=K)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        r.search(q.emb, tenants=q.tenants, config=cfg)
        best = min(best, time.perf_counter() - t0)
    return len(q.tenants) / best


def score(store, q: Questions, views) -> dict:
    r = Retriever(store)
    res = {}
    for kind, cfg in rankings():
        ranked = r.search(q.emb, tenants=q.tenants, config=cfg).index.cpu().numpy()
        sc = score_ranked(ranked, views, q.answers, q.evidence, k=K, max_tokens=256)
        for cut, metric in KEPT:
            res[f"{kind}|{cut}|{metric}"] = sc[cut, metric].astype(np.float64)
    return res


def run_shape(a, shape, embedder, merger, rows: list, scores: dict):
    bench = load_locomo(a.benchmark, nodes=shape)
    inp = bench.store(embedder, device="cpu")
    q = Questions(bench, embedder)
    embedder.flush()
    originals = dict(zip(inp.ids, inp.texts))
    base = score(inp, q, NodeViews.build(inp, originals))
    base_bytes = sum(len(t.encode("utf-8")) for t in inp.texts) + len(inp) * inp.dim * 4
    base_qps = qps(Retriever(inp), q)
    cfg0 = preset(a.preset)
    cfg0 = dataclasses.replace(cfg0, merge=dataclasses.replace(cfg0.merge, keys=0))
    spec = parse_method(a.method)
    conv = np.array(q.tenants)
    for ratio in a.ratios:
        path = os.path.join(a.out, "stores", shape, f"{spec.label.replace(':', '-')}_{ratio:g}.parquet")
        if os.path.exists(path):
            out = read_store(path)
        else:
            out = compress_with(spec, inp, spec.config(cfg0, ratio=ratio, seed=0), merger=merger, embedder=embedder,
                                device="cpu").store
            embedder.flush()
            write_store(out, path)
        w = preset(a.preset).merge.text_weight
        made = {b: derive_keys(inp, out.sources.arrow, max_keys=b, text_weight=w) for b in (None, 2, 3)}
        views = NodeViews.build(out, originals)
        text_b = sum(len(t.encode("utf-8")) for t in out.texts)
        emb = out.embeddings.clone()
        ref = None
        for name in ENCODINGS:
            text_dec, k, b = encode(name, emb, made, out.dim)
            out.embeddings, out.keys = text_dec, k
            sc = score(out, q, views)
            speed = qps(Retriever(out), q)
            total = text_b + b["vectors"] + b["keys"] + b["key_ids"] + b["codebook"]
            rec = {"shape": shape, "ratio": ratio, "encoding": name, "nodes": len(out), "key_rows": b["key_rows"],
                   "bytes": total, "bytes_pct": 100 * total / base_bytes,
                   "bytes_per_node": total / len(out), **{f"{x}_bytes": b[x] for x in b if x != "key_rows"},
                   "text_bytes": text_b, "qps": speed, "qps_ratio": speed / base_qps}
            for kind in ("plain", "agpr"):
                m = sc[f"{kind}|B|ansr"]
                rec[f"ansr_{kind}"] = 100 * float(np.nanmean(m)) / float(np.nanmean(base["plain|B|ansr"]))
            if name == "f32":
                ref = sc
            else:
                for kind in ("plain", "agpr"):
                    d = cluster_bootstrap(sc[f"{kind}|B|ansr"], ref[f"{kind}|B|ansr"], conv)
                    scale = 100 / float(np.nanmean(base["plain|B|ansr"]))
                    rec[f"vs_f32_{kind}"] = [d[0] * scale, d[1] * scale, d[2] * scale]
            for key, v in sc.items():
                scores[f"{shape}|{ratio:g}|{name}|{key}"] = v
            rows.append(rec)
            vs = rec.get("vs_f32_plain")
            print(f"{shape} {ratio:g} {name:8s} ansr@B {rec['ansr_plain']:5.1f} agpr {rec['ansr_agpr']:5.1f} "
                  f"bytes {rec['bytes_pct']:5.1f}% ({rec['bytes_per_node']:.0f} B/node) q/s x{rec['qps_ratio']:.2f}"
                  + (f" vs f32 {vs[0]:+.1f} [{vs[1]:+.1f}, {vs[2]:+.1f}]" if vs else ""), flush=True)
        out.embeddings = emb


def markdown(rows: list) -> str:
    """The side-by-side table: per encoding and cell, AnsR@B retention (plain / AGPR), the
    difference from f32 with its interval, and bytes against the uncompressed store."""
    cells = sorted({(r["shape"], r["ratio"]) for r in rows})
    head = "| encoding | " + " | ".join(f"{s} {r:g}" for s, r in cells) + " |"
    out = [head, "|" + " --- |" * (len(cells) + 1)]
    for name in ENCODINGS:
        line = [name]
        for c in cells:
            r = next((x for x in rows if (x["shape"], x["ratio"]) == c and x["encoding"] == name), None)
            if r is None:
                line.append("")
                continue
            vs = r.get("vs_f32_plain")
            d = f" ({vs[0]:+.1f} [{vs[1]:+.1f}, {vs[2]:+.1f}])" if vs else ""
            line.append(f"{r['ansr_plain']:.1f} / {r['ansr_agpr']:.1f}{d}; {r['bytes_pct']:.0f}%, "
                        f"{r['bytes_per_node']:.0f} B")
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--nodes", default="turns,facts")
    ap.add_argument("--method", default="memforest:matching")
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--table", action="store_true", help="only print OUT/codes.json as the Markdown table")
    a = ap.parse_args(argv)
    if a.table:
        with open(os.path.join(a.out, "codes.json")) as f:
            print(markdown(json.load(f)), end="")
        return
    a.ratios = [float(x) for x in a.ratios.split(",")]
    torch.set_num_threads(1)
    print_hardware()
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    rows: list = []
    scores: dict = {}
    for shape in a.nodes.split(","):
        run_shape(a, shape, embedder, ExtractiveMerger(), rows, scores)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "codes.json"), "w") as f:
            json.dump(rows, f, indent=1)
        np.savez_compressed(os.path.join(a.out, "scores.npz"), **scores)
        with open(os.path.join(a.out, "codes.md"), "w") as f:
            f.write(markdown(rows))
    print(f"wrote {a.out}/codes.json ({len(rows)} rows), scores.npz")


if __name__ == "__main__":
    main()
