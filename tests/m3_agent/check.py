"""Use an M3-Agent graph and its compressed version with M3-Agent's own code only (the copy in
``mmagent/``; nothing here imports memforest) and list what M3-Agent would see changed:

- characters: ``refresh_equivalences()`` on the whole graph, after
  ``truncate_memory_by_clip(c)`` at every clip c and after ``prune_memory_by_node_type``;
- search output: ``translate`` of every merged memory (dropped, raw ``<face_N>`` ids left, an
  Equivalence line inside) and ``search(...)`` clip-wise, memory-wise and with ``before_clip``;
- clip cutoffs, at every clip c: the original memories the compressed graph truncated at c
  holds against the uncompressed one's (``deleted``, ``leaked``), nodes listed under a clip
  that truncation deleted (M3-Agent's search would raise KeyError), and the originals
  ``search(..., before_clip=c)`` can reach (``hidden``: of clips <= c, not reachable;
  ``leaked_search``: of clips > c, reachable).

An original is identified by its node id; a merged node holds the ids in its
``metadata["merged_from"]``.

    python check.py video.pkl video.small.pkl   # prints the report as JSON; exit 1 on a failure
"""
import copy
import json
import pickle
import random
import re
import sys

from mmagent.retrieve import search, translate

RAW = re.compile(r"<(face|voice)_\d+>")
TEXT = ("episodic", "semantic")
CUTOFF_COUNTS = ("deleted", "leaked", "listed_but_deleted", "hidden_memwise", "hidden_clipwise", "leaked_search")


def characters(g):
    """refresh_equivalences() (fix_collisions breaks equal weights at random: seeded), then the
    characters as sorted lists of face/voice tags."""
    random.seed(0)
    g.refresh_equivalences()
    return sorted(sorted(v) for v in g.character_mappings.values())


def held(g):
    """The original text node ids the text nodes of ``g`` hold."""
    out = set()
    for i, n in g.nodes.items():
        if n.type in TEXT:
            out.update(n.metadata.get("merged_from", [i]))
    return out


def light(g):
    """A copy of ``g`` whose text nodes carry no vectors (truncation and refresh never read
    them), so that a deep copy per cutoff is cheap."""
    h = copy.copy(g)
    h.nodes = {}
    for i, n in g.nodes.items():
        m = copy.copy(n)
        if n.type in TEXT:
            m.embeddings = []
        h.nodes[i] = m
    return copy.deepcopy(h)


def truncated(g, c):
    h = copy.deepcopy(g)
    h.truncate_memory_by_clip(c, refresh=False)
    return h


def cutoff(U, C, Ulight, Clight, clip_of, c):
    """One clip cutoff c: counts of what the compressed graph loses, leaks or hides (see the
    module docstring) and whether the characters agree."""
    u, k = truncated(Ulight, c), truncated(Clight, c)
    want, got = held(u), held(k)
    listed = {i for ids in k.text_nodes_by_clip.values() for i in ids}
    past = {i for i, t in clip_of.items() if t <= c}
    clipwise = {x for kk, ids in C.text_nodes_by_clip.items() if kk <= c for i in ids
                for x in C.nodes[i].metadata.get("merged_from", [i])}
    memwise = {x for i, n in C.nodes.items() if n.type in TEXT and n.metadata["timestamp"] <= c
               for x in n.metadata.get("merged_from", [i])}
    return {"clip": c, "uncompressed": len(want), "compressed": len(got & want),
            "nodes": sum(n.type in TEXT for n in k.nodes.values()),
            "deleted": len(want - got), "leaked": len(got - want), "listed_but_deleted": len(listed - set(k.nodes)),
            "hidden_memwise": len(past - memwise), "hidden_clipwise": len(past - clipwise),
            "leaked_search": len((clipwise | memwise) - past), "characters_equal": characters(u) == characters(k)}


def search_problems(C, queries, before_clips):
    """Merged memories that ``translate`` drops, and memories out of ``translate`` / ``search``
    (clip-wise, memory-wise, with each ``before_clip``) that keep a raw id or an Equivalence line;
    with ``before_clip=c``, clips after c returned."""
    k = copy.deepcopy(C)
    characters(k)
    bad = {"dropped": [], "raw_ids": [], "equivalence_text": [], "after_cutoff": []}

    def look(memories):
        for m in memories:
            if RAW.search(m):
                bad["raw_ids"].append(m)
            if "equivalence" in m.lower():
                bad["equivalence_text"].append(m)

    for n in k.nodes.values():
        if n.type in TEXT and "merged_from" in n.metadata:
            out = translate(k, n.metadata["contents"])
            if len(out) != 1:
                bad["dropped"].append(n.metadata["contents"][0])
            look(out)
    for q in queries:
        for kw in [{}, {"mem_wise": True}] + [{"before_clip": c, "mem_wise": w} for c in before_clips
                                              for w in (False, True)]:
            mems, _, _ = search(k, q, [], topk=5, **kw)
            for key, ms in mems.items():
                look(ms)
                if "before_clip" in kw and int(key.split("_")[1]) > kw["before_clip"]:
                    bad["after_cutoff"].append(key)
    return {key: sorted(set(v)) for key, v in bad.items()}


def check(U, C, *, queries=None, before_clips=None):
    """The whole report for an uncompressed graph ``U`` and its compressed version ``C``."""
    clip_of = {i: n.metadata["timestamp"] for i, n in U.nodes.items() if n.type in TEXT}
    clips = sorted(U.text_nodes_by_clip)
    if queries is None:
        queries = [U.nodes[i].metadata["contents"][0] for i in U.text_nodes[::60]] + ["Who owns the laptop?"]
    if before_clips is None:
        before_clips = clips[len(clips) // 4::len(clips) // 4 or 1]
    Ul, Cl = light(U), light(C)
    rep = {"text_nodes": [len(clip_of), sum(n.type in TEXT for n in C.nodes.values())],
           "characters": [characters(copy.deepcopy(Ul)), characters(copy.deepcopy(Cl))]}
    pu, pc = copy.deepcopy(Ul), copy.deepcopy(Cl)
    random.seed(0)
    pu.prune_memory_by_node_type("episodic")
    random.seed(0)
    pc.prune_memory_by_node_type("episodic")
    rep["characters_pruned"] = [sorted(map(sorted, g.character_mappings.values())) for g in (pu, pc)]
    rep["cutoffs"] = [cutoff(U, C, Ul, Cl, clip_of, c) for c in clips]
    rep["search"] = search_problems(C, queries, before_clips)
    fail = []
    if rep["characters"][0] != rep["characters"][1]:
        fail.append(f"characters {rep['characters'][0]} became {rep['characters'][1]}")
    if rep["characters_pruned"][0] != rep["characters_pruned"][1]:
        fail.append("characters after prune_memory_by_node_type differ")
    for r in rep["cutoffs"]:
        fail += [f"cutoff {r['clip']}: {r[key]} {key}" for key in CUTOFF_COUNTS if r[key]]
        if not r["characters_equal"]:
            fail.append(f"cutoff {r['clip']}: characters differ")
    fail += [f"search: {len(v)} {key}, e.g. {v[0]!r}" for key, v in rep["search"].items() if v]
    rep["failures"] = fail
    return rep


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


if __name__ == "__main__":
    report = check(load(sys.argv[1]), load(sys.argv[2]))
    report["memforest_imported"] = sorted(m for m in sys.modules if m.startswith("memforest"))
    print(json.dumps(report, default=str))
    sys.exit(1 if report["failures"] or report["memforest_imported"] else 0)
