"""Small files in the published schemas of LongMemEval (``longmemeval_s.json``) and PersonaMem
(``questions_32k.csv`` + ``shared_contexts_32k.jsonl``), written by the tests (the real files are
large and not in the repository). Field names, nesting and value formats follow the releases:
LongMemEval's items with ``haystack_sessions`` of ``{role, content, has_answer}`` turns and dates
like ``"2023/05/20 (Sat) 02:21"``; PersonaMem's CSV with ``all_options`` as a Python list literal
of ``"(a) ..."`` strings and ``correct_answer`` like ``"(c)"``, its contexts one
``{id: [messages]}`` object per line. Every item, message and id is invented: only the layout
follows the releases (no benchmark data is kept in the repository)."""
from __future__ import annotations

import csv
import hashlib
import json

FILLER = [
    ("user", "Can you suggest a good stretching routine for the morning?"),
    ("assistant", "Sure: neck rolls, shoulder circles, a forward fold and a cat-cow, one minute each."),
    ("user", "What is a quick vegetarian dinner I could cook tonight?"),
    ("assistant", "A chickpea curry with spinach takes about twenty minutes."),
    ("user", "How do I keep basil alive on a windowsill?"),
    ("assistant", "Give it six hours of sun, water when the soil is dry, and pinch the tops."),
]


def _session(extra: list[tuple[str, str, bool]], start: int) -> list[dict]:
    turns = [{"role": r, "content": c} for r, c in FILLER[start:start + 2]]
    for role, content, ans in extra:
        t = {"role": role, "content": content}
        if ans:
            t["has_answer"] = True
        turns.append(t)
    return turns


def longmemeval_items() -> list[dict]:
    """Five items: marked evidence turns (one and two sessions), an abstention question, a
    question whose evidence is only named by ``answer_session_ids``, sessions in time order."""
    dates = ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 14:05", "2023/05/25 (Thu) 09:40"]
    items = []
    items.append({
        "question_id": "lme_q01", "question_type": "single-session-user",
        "question": "What did I study at university?", "answer": "Marine Biology",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": ["filler_a", "answer_q01", "filler_b"], "haystack_dates": dates,
        "haystack_sessions": [_session([], 0), _session([("user", "I graduated in Marine Biology, which "
                                                                  "helped me land the aquarium job.", True),
                                                         ("assistant", "Congratulations on the new job!", False)], 2),
                              _session([], 4)],
        "answer_session_ids": ["answer_q01"]})
    items.append({
        "question_id": "lme_q02", "question_type": "temporal-reasoning",
        "question": "What went wrong with my new bicycle after its first tune-up?",
        "answer": "the rear brake started squeaking", "question_date": "2023/05/30 (Tue) 10:00",
        "haystack_session_ids": ["s_x", "answer_q02_1", "answer_q02_2"], "haystack_dates": dates,
        "haystack_sessions": [_session([], 0),
                              _session([("user", "My new bicycle had its first tune-up on March 15th.", True)], 2),
                              _session([("user", "After the tune-up, the rear brake started squeaking, "
                                                 "so I took it back.", True)], 4)],
        "answer_session_ids": ["answer_q02_1", "answer_q02_2"]})
    items.append({
        "question_id": "lme_q01_abs", "question_type": "single-session-user",
        "question": "What did my sister study at university?",
        "answer": "The information provided is not enough. You mentioned your own studies but not your sister's.",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": ["filler_a", "answer_q01"], "haystack_dates": dates[:2],
        "haystack_sessions": [_session([], 0), _session([("user", "I graduated in Marine "
                                                                  "Biology.", False)], 2)],
        "answer_session_ids": ["answer_q01"]})
    items.append({
        "question_id": "lme_q03", "question_type": "knowledge-update",
        "question": "How many bikes do I own now?", "answer": 3, "question_date": "2023/06/01 (Thu) 08:00",
        "haystack_session_ids": ["answer_ku_1", "s_y", "answer_ku_2"], "haystack_dates": dates,
        "haystack_sessions": [_session([("user", "I own two bikes: a road bike and a commuter.", False)], 0),
                              _session([], 2),
                              _session([("user", "I just bought a mountain bike, so that makes three bikes.", False)],
                                       4)],
        "answer_session_ids": ["answer_ku_1", "answer_ku_2"]})
    items.append({
        "question_id": "lme_q04", "question_type": "multi-session",
        "question": "Which two cities did I visit for work this spring?", "answer": "Lisbon and Oslo",
        "question_date": "2023/06/02 (Fri) 18:30",
        "haystack_session_ids": ["answer_ms_1", "answer_ms_2"], "haystack_dates": dates[1:],
        "haystack_sessions": [_session([("user", "Back from a work trip to Lisbon, the client loved the demo.", True)],
                                       0),
                              _session([("user", "The Oslo work visit was cold but productive.", True)], 2)],
        "answer_session_ids": ["answer_ms_1", "answer_ms_2"]})
    return items


def write_longmemeval(path, items=None) -> list[dict]:
    items = longmemeval_items() if items is None else items
    with open(path, "w", encoding="utf-8") as f:
        json.dump(items, f)
    return items


CONTEXT_A = hashlib.sha256(b"fixture context A").hexdigest()  # invented ids in the releases' 64-hex shape
CONTEXT_B = hashlib.sha256(b"fixture context B").hexdigest()


def personamem_contexts() -> dict[str, list[dict]]:
    a = [{"role": "system", "content": "Current user persona: Name: Mira Castell. Gender Identity: Female."},
         {"role": "user", "content": "Patient: Joining the neighbourhood choir rehearsals was a real lift for me."},
         {"role": "assistant", "content": "Therapist: Singing together can steady both the breath and the mood."},
         {"role": "user", "content": "Patient: I also signed up for a pottery evening class."},
         {"role": "assistant", "content": "Therapist: Working with clay can be a calming way to express things."},
         {"role": "user", "content": "Patient: Lately the pottery class feels tedious and I stopped going."},
         {"role": "assistant", "content": "Therapist: It is fine to let an activity go when it no longer helps."}]
    b = [{"role": "system", "content": "Current user persona: Name: Ada Quist."},
         {"role": "user", "content": "User: I have started growing heirloom tomatoes on my balcony."},
         {"role": "assistant", "content": "Assistant: Heirloom tomatoes need deep pots and full sun."}]
    return {CONTEXT_A: a, CONTEXT_B: b}


def personamem_rows() -> list[dict]:
    """Four questions on two contexts; two share a context and an end index (one tenant)."""
    choir = ["(a) Certainly, singing can help, like the hiking club you joined.",
             "(b) Yes, as with the chess evenings you attended.",
             "(c) Absolutely. I recall you mentioned joining the neighbourhood choir rehearsals, which lifted "
             "your mood.",
             "(d) Indeed, like your pottery evenings working with clay."]
    pottery_now = ["(a) It's nice to see you're continuing with the pottery class.",
                   "(b) I remember you found the pottery class tedious lately and stopped going.",
                   "(c) It's nice to hear you're continuing with cooking classes.",
                   "(d) Pottery sounds interesting, though I'm unaware of your participation."]
    pottery_then = ["(a) It's nice to see you're continuing with the pottery class and the clay.",
                    "(b) I remember you found it tedious.",
                    "(c) It's nice to hear you're continuing with cooking classes.",
                    "(d) I did not know you liked gardening."]
    garden = ["(a) Try a bonsai workshop.", "(b) Since you grow heirloom tomatoes on your balcony, try basil next.",
              "(c) Try a pottery class.", "(d) Try salsa dancing."]
    base = {"topic": "therapy", "context_length_in_tokens": 1200, "context_length_in_letters": 6000,
            "distance_to_ref_in_blocks": 1, "distance_to_ref_in_tokens": 300, "distance_to_ref_proportion_in_context":
            "25.00%", "num_irrelevant_tokens": 0, "stereotypical": "No"}
    return [
        {**base, "question_id": "fixture-q1", "question_type": "recalling_facts_mentioned_by_the_user",
         "question": "Can singing in a group support mental health?", "correct_answer": "(c)",
         "all_options": repr(choir), "shared_context_id": CONTEXT_A, "end_index_in_shared_context": 5},
        {**base, "question_id": "fixture-q2", "question_type": "recalling_the_latest_user_preferences",
         "question": "I went to another pottery evening the other day.", "correct_answer": "(b)",
         "all_options": repr(pottery_now), "shared_context_id": CONTEXT_A, "end_index_in_shared_context": 7},
        {**base, "question_id": "fixture-q3", "question_type": "recalling_the_latest_user_preferences",
         "question": "I went to a pottery evening.", "correct_answer": "(a)",
         "all_options": repr(pottery_then), "shared_context_id": CONTEXT_A, "end_index_in_shared_context": 5},
        {**base, "question_id": "fixture-q4", "question_type": "recommendation_aligned_with_users_latest_preferences",
         "question": "Any idea for a new plant to grow?", "correct_answer": "(b)",
         "all_options": repr(garden), "shared_context_id": CONTEXT_B, "end_index_in_shared_context": 3},
    ]


COLUMNS = ["question_id", "question_type", "topic", "context_length_in_tokens", "context_length_in_letters",
           "distance_to_ref_in_blocks", "distance_to_ref_in_tokens", "distance_to_ref_proportion_in_context",
           "question", "correct_answer", "all_options", "shared_context_id", "end_index_in_shared_context",
           "num_irrelevant_tokens", "stereotypical"]


def write_personamem(folder, *, hf_columns: bool = False) -> tuple[str, str]:
    """``questions_32k.csv`` and ``shared_contexts_32k.jsonl`` in ``folder``; ``hf_columns``: the
    Hugging Face release's column names (``persona_id``, ``user_question_or_message``)."""
    q, c = folder / "questions_32k.csv", folder / "shared_contexts_32k.jsonl"
    with open(c, "w", encoding="utf-8") as f:
        for cid, msgs in personamem_contexts().items():
            f.write(json.dumps({cid: msgs}) + "\n")
    rows = personamem_rows()
    cols = list(COLUMNS)
    if hf_columns:
        cols = ["persona_id"] + [("user_question_or_message" if x == "question" else x) for x in cols]
        rows = [{"persona_id": i, **{("user_question_or_message" if k == "question" else k): v for k, v in r.items()}}
                for i, r in enumerate(rows)]
    with open(q, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return str(q), str(c)
