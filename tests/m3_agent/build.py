"""Build M3-Agent VideoGraphs clip by clip with M3-Agent's own code (the copy in ``mmagent/``),
as m3_agent/memorization_memory_graphs.py does: per clip, the face and voice nodes it brings
(voices first, then faces, as process_voices / process_faces add them), then
``process_memories(episodic)`` and ``process_memories(semantic)``; ``refresh_equivalences()``
at the end. The model's memories are scripted; text vectors come from the stand-in
``mmagent/utils/chat_api.py``, face (512) and voice (192) vectors are random unit vectors.
Nothing here imports memforest.

    python build.py video.pkl          # 24 clips, 4 people: 332 episodic, 45 semantic nodes
    python build.py small.pkl --small  # 2 faces, 2 voices, 2 Equivalence lines + 1 fact each
"""
import argparse
import pickle
import sys

import numpy as np

from mmagent.memory_processing_qwen import process_memories
from mmagent.videograph import VideoGraph

PLACES = ["in the kitchen", "in the living room", "at the dining table", "in the study", "on the balcony",
          "in the hallway", "in the garden", "at the front door"]
OBJECTS = ["the laptop", "a cup of coffee", "the groceries", "a red notebook", "the remote control", "a phone",
           "the flower pot", "a set of keys", "the newspaper", "a backpack", "the guitar", "a plate of cookies"]
VERBS = ["picks up", "puts down", "looks at", "hands over", "carries", "cleans", "opens", "points at",
         "searches for", "moves"]
SAYS = ["'Where did I leave it?'", "'Dinner is ready.'", "'Can you help me with this?'", "'I will be back soon.'",
        "'Have you seen my keys?'", "'That looks great.'", "'Let us go outside.'", "'I am running late.'"]
FACTS = ["{a} is the owner of {o}.", "{a} is a student who studies late.", "{a} likes to cook for the family.",
         "{a} and {b} appear to be close friends.", "{a} seems worried about {o}.", "{a} is responsible for {o}.",
         "{a} prefers to work {p}.", "{a} often forgets {o}.", "{a} is the parent of {b}.", "{a} is polite to {b}.",
         "{a} enjoys spending time {p}.", "{a} treats {o} with care."]
PLAIN = ["The household keeps a regular daily routine.", "The house is tidy and well organised.",
         "The family eats dinner together in the evening.", "Visitors are rare in this house."]


def unit(rng, d):
    """A random unit vector of d floats, as a list (what M3-Agent stores)."""
    v = rng.standard_normal(d)
    return (v / np.linalg.norm(v)).tolist()


def build_video(clips=24, seed=0):
    """A video of ``clips`` clips with four people (face and voice each), who first appear in
    clips 0-4; 13 or 14 episodic memories per clip, the Equivalence line of every person
    present (repeats are reinforced by process_memories, not added) and one or two facts."""
    rng = np.random.default_rng(seed)
    g = VideoGraph()
    # person -> (clip the face first appears, clip the voice first appears)
    first = {0: (0, 0), 1: (0, 1), 2: (2, 3), 3: (4, 4)}
    face, voice = {}, {}
    n_epi = [14] * clips
    for c in rng.choice(clips, size=4, replace=False):  # 332 episodic memories over 24 clips
        n_epi[c] = 13
    eq_done = set()
    fact_i = 0
    for c in range(clips):
        for p, (fc, vc) in first.items():  # voices first, then faces (process_segment's order)
            if vc == c:
                voice[p] = g.add_voice_node({"embeddings": [unit(rng, 192)], "contents": [f"asr of person {p}"]})
        for p, (fc, vc) in first.items():
            if fc == c:
                face[p] = g.add_img_node({"embeddings": [unit(rng, 512)], "contents": [f"face{p}.jpg"]})
        here = [p for p in first if p in face or p in voice]
        present = sorted(rng.choice(here, size=min(len(here), int(rng.integers(2, 4))), replace=False).tolist())
        place = PLACES[(c // 3) % len(PLACES)]

        def tag(p):
            if p in face and (p not in voice or rng.random() < 0.7):
                return f"<face_{face[p]}>"
            return f"<voice_{voice[p]}>"

        epi = []
        for i in range(n_epi[c]):
            p = present[i % len(present)]
            if p in voice and rng.random() < 0.25:
                epi.append(f"<voice_{voice[p]}> says, {SAYS[int(rng.integers(len(SAYS)))]}")
            else:
                o = OBJECTS[int(rng.integers(len(OBJECTS)))]
                epi.append(f"{tag(p)} {VERBS[int(rng.integers(len(VERBS)))]} {o} {place}.")
        sem = []
        for p in present:
            if p in face and p in voice:
                sem.append(f"Equivalence: <face_{face[p]}>, <voice_{voice[p]}>.")  # repeats are reinforced
        for _ in range(1 if c == 5 else 2):
            a, b = present[0], present[-1]
            o = OBJECTS[(fact_i + fact_i // len(FACTS)) % len(OBJECTS)]
            f = FACTS[fact_i % len(FACTS)].format(a=tag(a), b=tag(b), o=o, p=place)
            sem.append(f if fact_i % 7 else PLAIN[(fact_i // 7) % len(PLAIN)])
            fact_i += 1
        process_memories(g, epi, c, type="episodic")
        process_memories(g, sem, c, type="semantic")
    g.refresh_equivalences()
    return g


def build_small():
    """Two faces, two voices; in one clip the two Equivalence lines and one fact about each person."""
    rng = np.random.default_rng(0)
    g = VideoGraph()
    f0 = g.add_img_node({"embeddings": [unit(rng, 512)], "contents": ["face0.jpg"]})
    v1 = g.add_voice_node({"embeddings": [unit(rng, 192)], "contents": ["asr 1"]})
    f2 = g.add_img_node({"embeddings": [unit(rng, 512)], "contents": ["face2.jpg"]})
    v3 = g.add_voice_node({"embeddings": [unit(rng, 192)], "contents": ["asr 3"]})
    process_memories(g, [f"Equivalence: <face_{f0}>, <voice_{v1}>.", f"Equivalence: <face_{f2}>, <voice_{v3}>.",
                         f"<face_{f0}> is the owner of the laptop.", f"<face_{f2}> waters the plants every morning."],
                     0, type="semantic")
    g.refresh_equivalences()
    return g


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    g = build_small() if a.small else build_video(a.clips, a.seed)
    assert not any(m.startswith("memforest") for m in sys.modules)
    with open(a.out, "wb") as f:
        pickle.dump(g, f)
    types = [n.type for n in g.nodes.values()]
    print(f"{a.out}: clips {len(g.text_nodes_by_clip)}, episodic {types.count('episodic')}, semantic "
          f"{types.count('semantic')}, faces {types.count('img')}, voices {types.count('voice')}, "
          f"characters {g.character_mappings}")
