"""Stand-in for M3-Agent's mmagent/utils/chat_api.py (not copied: it calls hosted models).

``parallel_get_embedding(model, texts)`` returns ``(embeddings, tokens)`` like the original,
with deterministic unit vectors instead of an API call, of text-embedding-3-large's size
(``DIM`` = 3072; a test that only needs the structure may set it lower). A text's vector is
a part shared by every text (unrelated texts have cosine about 0.2, as with a real model,
so process_memories' ``similarity < 0`` branch stays rare), plus its *template*'s part (the
text with every ``<face_N>`` / ``<voice_N>`` / ``<character_N>`` tag masked), plus a little
noise of its own: two texts that differ only in ids are nearly identical (cosine about 0.99),
as "Equivalence: <face_0>, <voice_1>." and "Equivalence: <face_2>, <voice_3>." are.
"""
import re
import zlib

import numpy as np

DIM = 3072
SHARED, NOISE = 0.5, 0.1
_TAG = re.compile(r"<(face|voice|character)_\d+>")


def _gauss(key: str) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(key.encode("utf-8"))).standard_normal(DIM)  # (DIM,)


def embed(text: str) -> list:
    """The unit vector of ``text`` (``DIM`` floats)."""
    v = SHARED * _gauss("shared") + _gauss("template:" + _TAG.sub("<X>", text)) + NOISE * _gauss("text:" + text)
    return (v / np.linalg.norm(v)).tolist()


def parallel_get_embedding(model, texts):
    return [embed(t) for t in texts], sum(len(t.split()) for t in texts)


def get_embedding_with_retry(model, text):
    return embed(text), len(text.split())
