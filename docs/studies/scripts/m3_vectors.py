"""What each bound on an M3-Agent text node's vectors keeps (``--m3-vectors``, docs/adapters.md).

A graph is built by M3-Agent's own code (``tests/m3_agent/build.py``, in a process that never
imports memforest: 24 clips, 377 text nodes of one 3072-float vector each), compressed with
the shipped ``memforest`` preset (every source kept as a key) at each ratio under each bound
(1, 2, 3, ..., ``auto``: input text vectors // output text nodes, ``all``: no bound, every node
padded to the longest list as before the bound), saved, and loaded back by ``pickle.load``
with M3-Agent's classes. Then each input text node's own vector is a query to M3-Agent's
``search_text_nodes(mode="max")`` (what ``retrieve_from_videograph`` uses) on the compressed
graph: a hit when the output node holding that input node (its ``merged_from``) is in the
top k. The input graph itself is the first line (every node finds itself unless an equal
vector ties it). Prints one line per (ratio, bound) and writes flat JSON records.

    python docs/studies/scripts/m3_vectors.py [--ratios 0.5,0.7] [--bounds 1,2,3,auto,all] [--k 1,5]
        [--clips 24] [--out runs/m3_vectors.json]

Each node's vector list is turned into one array before the queries (``search_text_nodes``
would convert the lists again on every call: the same numbers, much slower).
"""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
M3_DIR = os.path.join(HERE, "..", "..", "..", "tests", "m3_agent")
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)

from common import print_hardware, write_records  # noqa: E402

TEXT = ("episodic", "semantic")


def build(path: str, clips: int) -> str:
    """The graph built by M3-Agent's code, in a process that sees only its copy."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = M3_DIR
    p = subprocess.run([sys.executable, os.path.join(M3_DIR, "build.py"), path, "--clips", str(clips)],
                       capture_output=True, text=True, env=env, cwd=M3_DIR, check=True)
    return p.stdout.strip()


def load_m3(path: str):
    """A graph pickle loaded with M3-Agent's own classes, every text node's vectors as one array."""
    with open(path, "rb") as f:
        g = pickle.load(f)
    for n in g.nodes.values():
        if n.type in TEXT:
            n.embeddings = np.asarray(n.embeddings, dtype=np.float64)
    return g


def self_query(graph_in, graph_out, ks: list[int]) -> dict:
    """Per k: the share of input text nodes whose holder in ``graph_out`` is in the top k of
    ``search_text_nodes([own vector], mode="max")``."""
    holder = {}
    for nid, n in graph_out.nodes.items():
        if n.type in TEXT:
            for x in n.metadata.get("merged_from", [nid]):
                holder[x] = nid
    queries = [nid for nid, n in graph_in.nodes.items() if n.type in TEXT]
    hits = {k: 0 for k in ks}
    for nid in queries:
        ranked = [i for i, _ in graph_out.search_text_nodes([graph_in.nodes[nid].embeddings[0]], mode="max")]
        at = ranked.index(holder[nid])
        for k in ks:
            hits[k] += at < k
    return {f"hit@{k}": hits[k] / len(queries) for k in ks} | {"queries": len(queries)}


def vectors_of(g) -> tuple[int, int, int]:
    """(text nodes, text-node vectors, vectors per node)."""
    counts = [len(n.embeddings) for n in g.nodes.values() if n.type in TEXT]
    return len(counts), sum(counts), max(counts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratios", default="0.5,0.7")
    p.add_argument("--bounds", default="1,2,3,auto,all")
    p.add_argument("--k", default="1,5", help="top-k cut-offs of the self-query")
    p.add_argument("--clips", type=int, default=24)
    p.add_argument("--preset", default="memforest")
    p.add_argument("--out", default=os.path.join("runs", "m3_vectors.json"))
    a = p.parse_args(argv)

    print_hardware()
    ks = [int(x) for x in a.k.split(",")]
    sys.path.insert(0, M3_DIR)  # M3-Agent's classes for pickle.load
    with tempfile.TemporaryDirectory(prefix="m3_vectors_") as tmp:
        records = run(tmp, a, ks)
    write_records(a.out, records)
    return 0


def run(tmp: str, a, ks: list[int]) -> list[dict]:
    """Build, compress under every (ratio, bound), query; the records."""
    from memforest_gpu.adapters.m3agent import compress_video_graph, load_video_graph, save_video_graph
    from memforest_gpu.config import CompressConfig, MergeConfig

    src = os.path.join(tmp, "video.pkl")
    print(f"# {build(src, a.clips)}")
    g_in = load_m3(src)
    n_in, v_in, _ = vectors_of(g_in)
    base = CompressConfig.preset(a.preset)
    cols = " ".join(f"{'hit@' + str(k):>7}" for k in ks)
    print(f"{'ratio':>5} {'bound':>5} {'b':>3} {'nodes':>5} {'vec in':>6} {'vec out':>7} {'per node':>8} {cols}")
    records = []
    ref = self_query(g_in, g_in, ks)
    print(f"{'-':>5} {'input':>5} {'-':>3} {n_in:>5} {v_in:>6} {v_in:>7} {1:>8} "
          + " ".join(f"{ref[f'hit@{k}']:>7.3f}" for k in ks))
    records.append({"ratio": 0.0, "bound": "input", "text_nodes": n_in, "vectors_in": v_in, "vectors_out": v_in,
                    **ref})
    for ratio in [float(x) for x in a.ratios.split(",")]:
        cfg = CompressConfig(partition=base.partition, spanning=base.spanning,
                             merge=MergeConfig(**{**base.merge.__dict__, "ratio": ratio}))
        for b in a.bounds.split(","):
            bound = b if b in ("auto", "all") else int(b)
            t0 = time.perf_counter()
            res = compress_video_graph(load_video_graph(src), cfg, vectors=bound)
            seconds = time.perf_counter() - t0
            dst = os.path.join(tmp, f"out_{ratio}_{b}.pkl")
            save_video_graph(res.graph, dst)
            g_out = load_m3(dst)
            n_out, v_out, per = vectors_of(g_out)
            hit = self_query(g_in, g_out, ks)
            shown = "-" if res.info["vector_bound"] is None else res.info["vector_bound"]
            print(f"{ratio:>5} {b:>5} {shown:>3} {n_out:>5} {v_in:>6} {v_out:>7} {per:>8} "
                  + " ".join(f"{hit[f'hit@{k}']:>7.3f}" for k in ks), flush=True)
            records.append({"ratio": ratio, "bound": b, "vector_bound": res.info["vector_bound"], "text_nodes": n_out,
                            "vectors_in": v_in, "vectors_out": v_out, "vectors_per_node": per,
                            "compress_seconds": round(seconds, 3), "preset": a.preset, **hit})
            os.remove(dst)
    return records


if __name__ == "__main__":
    sys.exit(main())
