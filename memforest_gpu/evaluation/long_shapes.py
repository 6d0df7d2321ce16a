"""Long-memory shapes of the LoCoMo dev file (issue 38, docs/long-memories.md).

Every shape has the same tenants (conversations) as the file; ``load_shape(path, name)``:

- ``"turns"``, ``"facts"``: :func:`~.locomo.load_locomo` as it is (one node per turn / per fact);
- ``"w4"``, ``"w8"``: windows of 4 / 8 consecutive turns (``load_locomo(turns_per_node=n)``);
- ``"sessions"``: one node per session, id ``"{sample_id}:S{n}"``, text the session's turn texts
  joined by spaces (each ``"{speaker}: {text}"`` as in the turns shape), timestamp the session's
  last turn's; a question's evidence is the sessions holding its evidence turns;
- ``"ku"`` (knowledge updates, long memories): the 4-turn windows with values that change over
  time said by the speakers. For each conversation and each of its two speakers, every attribute
  of :data:`UPDATES` (a job, a city, a car ...) gets an old value said in a session of the first
  half of the conversation and a new value in a session of the second half ("I drive a Honda
  Civic." ... "I sold my old car, I now drive a Subaru Outback."), each appended to one of the
  speaker's turns of that session; values, sessions and turns are drawn with ``random.Random``
  seeded by the seed and the conversation. The question ("What car does Caroline drive now?")
  has the new value as answer and the window with the new value as evidence (category ``"ku"``,
  100 questions, no LoCoMo question); ``Benchmark.info["updates"]`` keeps, per question id, the
  old and new values and the ids of the nodes holding them (the diagnostic reads them).
- ``"ku_facts"``: the same updates as facts (the facts shape plus "Caroline drives a Honda
  Civic." ... "Caroline now drives a Subaru Outback.", timestamped at the session's date plus
  900 + j seconds, after the session's own facts); the shape of a Mem0 store that was never
  told to update.
"""
from __future__ import annotations

import random

from ..config import ConfigError
from .dataset import Benchmark, Question
from .locomo import _windows, load_locomo

__all__ = ["SHAPES", "UPDATES", "load_shape", "regroup_sessions", "knowledge_updates", "knowledge_updates_said"]

SHAPES = ("turns", "facts", "w4", "w8", "sessions", "ku", "ku_facts")

#: (attribute, question, values, old fact, new fact, old said, new said): facts name the speaker
#: ``{p}``, what a speaker says is in the first person; ``{v}`` the value
UPDATES = (
    ("job", "What does {p} work as now?",
     ("nurse", "carpenter", "pharmacist", "translator", "librarian", "electrician", "dentist", "pilot"),
     "{p} works as a {v}.", "{p} now works as a {v}.", "I work as a {v} these days.",
     "I switched jobs, I now work as a {v}."),
    ("city", "Where does {p} live now?", ("Denver", "Portland", "Austin", "Boston", "Chicago", "Seattle", "Phoenix"),
     "{p} lives in {v}.", "{p} has moved and now lives in {v}.", "I live in {v}.", "I moved, I now live in {v}."),
    ("car", "What car does {p} drive now?",
     ("Honda Civic", "Subaru Outback", "Ford Focus", "Toyota Prius", "Mazda Miata", "Kia Soul"),
     "{p} drives a {v}.", "{p} now drives a {v}.", "I drive a {v}.", "I sold my old car, I now drive a {v}."),
    ("gym", "Which gym does {p} train at now?", ("Ironworks", "FitHub", "Peakform", "Corezone", "Powerhouse"),
     "{p} trains at the {v} gym.", "{p} switched gyms and now trains at the {v} gym.", "I train at the {v} gym.",
     "I switched gyms, I now train at the {v} gym."),
    ("book", "What book is {p} reading now?", ("Dune", "Middlemarch", "Beloved", "Rebecca", "Walden", "Ulysses"),
     "{p} is reading {v}.", "{p} is now reading {v}.", "I'm reading {v} right now.", "I'm now reading {v}."),
    ("phone", "What phone does {p} use now?", ("Pixel", "iPhone", "Galaxy", "Nokia", "Motorola", "Xperia"),
     "{p} uses a {v} phone.", "{p} now uses a {v} phone.", "I use a {v} phone.", "I now use a {v} phone."),
    ("coffee", "What is {p}'s usual coffee order now?",
     ("latte", "espresso", "cappuccino", "mocha", "americano", "macchiato"),
     "{p}'s usual coffee order is a {v}.", "{p}'s usual coffee order is now a {v}.", "My usual coffee order is a {v}.",
     "My usual coffee order is now a {v}."),
    ("running", "How many miles a week does {p} run now?", ("5", "8", "12", "15", "20", "25"),
     "{p} runs {v} miles a week.", "{p} now runs {v} miles a week.", "I run {v} miles a week.",
     "I now run {v} miles a week."),
    ("team", "Which team is {p} a fan of now?", ("Lakers", "Celtics", "Yankees", "Dodgers", "Packers", "Warriors"),
     "{p} is a fan of the {v}.", "{p} is now a fan of the {v}.", "I'm a fan of the {v}.", "I'm now a fan of the {v}."),
    ("language", "Which language is {p} learning now?",
     ("Spanish", "French", "German", "Japanese", "Italian", "Korean"),
     "{p} is learning {v}.", "{p} is now learning {v}.", "I'm learning {v}.", "I'm now learning {v}."),
)


def load_shape(path: str, name: str, *, seed: int = 0) -> Benchmark:
    """The benchmark of shape ``name`` (:data:`SHAPES`) built from LoCoMo's JSON at ``path``."""
    if name not in SHAPES:
        raise ConfigError("shape", f"must be one of {list(SHAPES)}, got {name!r}")
    if name in ("turns", "facts"):
        return load_locomo(path, nodes=name)
    if name in ("w4", "w8"):
        return load_locomo(path, turns_per_node=int(name[1:]))
    if name == "sessions":
        return regroup_sessions(load_locomo(path))
    if name == "ku_facts":
        return knowledge_updates(load_locomo(path, nodes="facts"), seed=seed)
    return knowledge_updates_said(load_locomo(path), seed=seed)


def regroup_sessions(turns: Benchmark) -> Benchmark:
    """The turns shape -> one node per session (see the module doc)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for n in turns.nodes:
        groups.setdefault((n["tenant"], n["metadata"]["session"]), []).append(n)
    nodes, where = [], {}
    for (tenant, s), group in groups.items():
        sid = f"{tenant}:S{s}"
        where.update({n["id"]: sid for n in group})
        nodes.append({"id": sid, "text": " ".join(n["text"] for n in group), "timestamp": group[-1]["timestamp"],
                      "tenant": tenant, "metadata": {"session": s, "turns": [n["id"] for n in group]}})
    qs = [Question(q.id, q.tenant, q.question, q.answer, tuple(dict.fromkeys(where[e] for e in q.evidence)),
                   q.category) for q in turns.questions]
    name = turns.name + "_sessions"
    return Benchmark(name, nodes, qs, info={**turns.info, "nodes_shape": "sessions"})


def _plan(tenant: str, sessions: list[int], speakers: list[str], seed: int) -> list[tuple]:
    """The updates of one conversation: (speaker, attribute index, old, new, old session, new
    session)."""
    rng = random.Random(f"{seed}:{tenant}")
    half = max(1, len(sessions) // 2)
    out = []
    for p in speakers:
        for j, u in enumerate(UPDATES):
            old, new = rng.sample(u[2], 2)
            out.append((p, j, old, new, rng.choice(sessions[:half]), rng.choice(sessions[half:])))
    return out


def _question(tenant: str, p: str, j: int, old: str, new: str, ids: tuple[str, str], evidence: tuple, updates: dict):
    attr, q_t = UPDATES[j][:2]
    qid = f"{tenant}:ku:{p}:{attr}"
    updates[qid] = {"old": old, "new": new, "old_id": ids[0], "new_id": ids[1]}
    return Question(qid, tenant, q_t.format(p=p), new, evidence, "ku")


def knowledge_updates(facts: Benchmark, *, seed: int = 0) -> Benchmark:
    """The facts shape plus written update facts and their questions (``"ku_facts"``)."""
    by_tenant: dict[str, list[dict]] = {}
    for n in facts.nodes:
        by_tenant.setdefault(n["tenant"], []).append(n)
    nodes = list(facts.nodes)
    questions, updates = [], {}
    for tenant, tnodes in by_tenant.items():
        t0 = {}  # session -> its date (its first fact's timestamp minus its index)
        for n in tnodes:
            t0[n["metadata"]["session"]] = min(t0.get(n["metadata"]["session"], n["timestamp"]), n["timestamp"])
        speakers = list(dict.fromkeys(n["metadata"]["speaker"] for n in tnodes))
        for p, j, old, new, s_old, s_new in _plan(tenant, sorted(t0), speakers, seed):
            ids = (f"{tenant}:uo:{p}:{UPDATES[j][0]}", f"{tenant}:un:{p}:{UPDATES[j][0]}")
            for nid, s, tmpl, v in ((ids[0], s_old, UPDATES[j][3], old), (ids[1], s_new, UPDATES[j][4], new)):
                nodes.append({"id": nid, "text": tmpl.format(p=p, v=v), "timestamp": t0[s] + 900 + j, "tenant": tenant,
                              "metadata": {"session": s, "speaker": p, "update": UPDATES[j][0]}})
            questions.append(_question(tenant, p, j, old, new, ids, (ids[1],), updates))
    nodes.sort(key=lambda n: (n["tenant"], n["timestamp"]))
    info = {"nodes_shape": "ku_facts", "updates": updates, "update_facts": 2 * len(questions)}
    return Benchmark(facts.name.replace("_facts", "") + "_ku_facts", nodes, questions, info=info)


def knowledge_updates_said(turns: Benchmark, *, n: int = 4, seed: int = 0) -> Benchmark:
    """The turns shape with the updates said by the speakers, in windows of ``n`` turns (``"ku"``).

    Each old / new value is said in the first person at the end of one of the speaker's turns of
    its session, drawn with the same generator; the question's evidence is the window holding the
    turn with the new value."""
    by_tenant: dict[str, list[dict]] = {}
    for x in turns.nodes:
        by_tenant.setdefault(x["tenant"], []).append(dict(x))
    nodes, questions, updates = [], [], {}
    for tenant, tnodes in by_tenant.items():
        rng = random.Random(f"{seed}:{tenant}:turns")
        sessions = sorted({x["metadata"]["session"] for x in tnodes})
        speakers = list(dict.fromkeys(x["metadata"]["speaker"] for x in tnodes))
        plan = _plan(tenant, sessions, speakers, seed)
        said = []
        for p, j, old, new, s_old, s_new in plan:
            pair = []
            for s, tmpl, v in ((s_old, UPDATES[j][5], old), (s_new, UPDATES[j][6], new)):
                own = [x for x in tnodes if x["metadata"]["session"] == s and x["metadata"]["speaker"] == p]
                t = rng.choice(own or [x for x in tnodes if x["metadata"]["session"] == s])
                t["text"] += " " + tmpl.format(v=v)
                pair.append(t["id"])
            said.append(pair)
        made, where = _windows(tnodes, tenant, n)
        nodes += made
        for (p, j, old, new, _, _), (t_old, t_new) in zip(plan, said):
            ids = (where[t_old[len(tenant) + 1:]][0], where[t_new[len(tenant) + 1:]][0])
            questions.append(_question(tenant, p, j, old, new, ids, (ids[1],), updates))
    info = {"nodes_shape": "ku", "turns_per_node": n, "updates": updates}
    return Benchmark(turns.name + f"_ku_w{n}", nodes, questions, info=info)
