"""Small synthetic benchmarks and a fake embedder for the evaluation tests (no model, no data)."""
from __future__ import annotations

import hashlib
import re

import numpy as np
import torch

from memforest_gpu.evaluation.dataset import Benchmark, Question

DAY0 = 1683554160.0  # 8 May 2023, 13:56 UTC
_WORD = re.compile(r"[a-z0-9]+")


class BagOfWordsEmbedder:
    """Deterministic hashed bag of words: texts sharing words are similar, identical
    texts identical. ``calls`` counts the texts it embedded (to check caching)."""

    name = "bag-of-words-64"
    dim = 64
    max_tokens = 256

    def __init__(self):
        self.calls = 0

    def embed(self, texts):
        texts = list(texts)
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in _WORD.findall(t.lower()):
                h = int.from_bytes(hashlib.md5(w.encode()).digest()[:4], "little")
                out[i, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
            if not out[i].any():
                out[i, 0] = 1.0
        return torch.nn.functional.normalize(torch.from_numpy(out), dim=1)

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]


# four facts per tenant with disjoint vocabularies; the question shares words with its fact
FACTS = [
    ("Alice: my cat is called Miso.", "What is the cat called?", "Miso"),
    ("Alice: I bought a red bicycle in Porto.", "Where was the red bicycle bought?", "Porto"),
    ("Alice: violin lessons start on Tuesday evenings.", "When do violin lessons start?", "Tuesday evenings"),
    ("Alice: grandmother bakes plum dumplings every winter.", "What does grandmother bake every winter?",
     "plum dumplings"),
]


def duplicate_facts_benchmark(tenants=("t0", "t1")) -> Benchmark:
    """Each tenant states each of :data:`FACTS` twice, word for word, on one day.

    At ratio 0.5 exactly one merge order keeps every answer within a one-fact budget:
    merging each fact with its own copy (cosine 1, the maximum spanning tree's edges),
    which the extractive merger turns back into the fact alone. Any other pairing joins
    two facts in one node, and a budget of one fact cuts the second one off.
    """
    nodes, qs = [], []
    for t in tenants:
        order = [0, 1, 2, 3, 0, 1, 2, 3]  # copies apart in time
        for j, f in enumerate(order):
            nodes.append({"id": f"{t}:n{j}", "text": FACTS[f][0], "timestamp": DAY0 + 60 * j, "tenant": t})
        for f, (_, question, answer) in enumerate(FACTS):
            qs.append(Question(f"{t}:q{f}", t, question, answer, (f"{t}:n{f}", f"{t}:n{f + 4}"), str(1 + f % 2)))
    return Benchmark("dupfacts", nodes, qs)


def fact_budget() -> int:
    """Whitespace tokens of the longest fact as rendered ("[8 May 2023] " adds 3)."""
    return max(len(f[0].split()) for f in FACTS) + 3
