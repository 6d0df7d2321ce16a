"""``memforest info``: what a store holds, read without embedding anything (its flags:
:mod:`.search_args`)."""
from __future__ import annotations

import json

import torch

from ..api import read_store
from ..printable import printable
from ..store.io import detect_format
from ..store.size import bytes_per_vector, store_size
from .report_text import kb
from .running import guarded
from .search_args import check_info

__all__ = ["run"]


@guarded
def run(a) -> int:
    """``memforest info``: counts, tenants, dimension, keys, size and time span of a store."""
    check_info(a)
    detect_format(a.store, None, flag=None)  # no --format to suggest here
    probe = _NoVectors()
    st = read_store(a.store, embedder=probe)
    info = st.info()
    if probe.used:  # the file holds no vectors: counts only
        info["dim"], info["embedder"] = None, None
    info["has_embeddings"] = not probe.used
    if not probe.used:  # rows and bytes, and the vectors the uncompressed store takes in the same encoding
        size = store_size(st)
        info["size"] = size.to_dict()
        info["uncompressed_vector_bytes"] = size.originals * bytes_per_vector(st.dim, size.encoding)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"nodes      {info['nodes']}  (standing for {info['originals']} originals; {info['merged_nodes']} merged)")
    print(f"tenants    {info['tenants']}")
    for t, n in info["nodes_per_tenant"].items():
        print(f"  {printable(t):<24} {n}")
    if probe.used:
        print("dimension  none  (no embeddings stored: compress and search embed it with all-MiniLM-L6-v2, "
              "or --embedder PATH)")
    else:
        print(f"dimension  {info['dim']}  (embedder: {info['embedder'] or 'not recorded'})")
    if info["keys_rule"] is not None:
        rule = info["keys_rule"]
        print(f"keys       {info['keys']}  (merged nodes searched by {rule['text_weight']:g} x text + "
              f"{1 - rule['text_weight']:g} x best of at most {rule['max_keys'] or 'all'} keys)")
    if "size" in info:
        z, full = info["size"], info["uncompressed_vector_bytes"]
        print(f"size       {z['rows']} vector rows searched ({z['rows'] / max(z['originals'], 1):.2f} per memory), "
              f"{z['vectors']} vectors held; texts {kb(z['text_bytes'])} + vectors {kb(z['vector_bytes'])} "
              f"({z['encoding']})")
        if z["originals"] != z["nodes"] or z["vectors"] != z["nodes"]:
            print(f"           uncompressed, in {z['encoding']}: {z['originals']} vectors, {kb(full)} (these "
                  f"vectors are {z['vector_bytes'] / max(full, 1):.0%} of that); the originals' texts are not kept "
                  "apart in the file (compress reports both sizes)")
    print(f"time span  {info['time_first']} .. {info['time_last']}")
    return 0


class _NoVectors:
    """`info` never embeds: a file without vectors gets a placeholder unit vector per node
    (never shown; ``used`` tells) so that its counts can still be reported."""

    name = None
    dim = 1

    def __init__(self):
        self.used = False

    def embed(self, texts):
        self.used = True
        return torch.ones(len(texts), 1)
