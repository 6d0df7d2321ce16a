"""The steps of the GPU verification run (bench/gpu.py runs each in its own process).

    python bench/gpu_steps.py plan --out runs/gpu [--rehearse]

Each step appends its records to ``<out>/gpu_records.jsonl`` as it goes (bench/gpu_record.py).
``--rehearse``: the same code at tiny sizes on the CPU. Nothing here imports torch or
memforest_gpu at module level, so bench/gpu.py can read :data:`STEPS` before the project
is importable.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import partial
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from gpu_record import RECORDS, append_record  # noqa: E402


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: float  # on a GPU
    rehearse_s: float  # rehearsal on the CPU
    what: str


# in order of value; limits sum to about the 470 s budget (bench/gpu.py stops at the budget anyway)
STEPS = [
    Step("agreement", 110, 60,
         "CUDA agreement: pytest on CUDA, kernels CUDA vs CPU, Triton vs PyTorch, engine invariants"),
    Step("plan", 90, 40, "1M nodes d=384: partition + trees + first-round plan, host reads"),
    Step("kmeans", 40, 30, "k-means assignment TFLOP/s against the measured matmul ceiling"),
    Step("merge", 140, 60, "LLM merges/s and tokens/s (Qwen2.5 shapes, random weights) + MiniLM re-embedding"),
    Step("retrieval", 45, 30, "1M nodes, 10k batched queries: top-k and AGPR"),
    Step("optional", 25, 30, "faiss-gpu and vLLM, where importable"),
]

SIZES = {
    "gpu": dict(
        pytest=[("kernels", ["tests/test_kernels_*.py"], 30),  # globs are expanded in the checkout
                ("triton", ["tests/test_triton_kernels.py", "-m", "not slow"], 15),
                ("engine", ["tests/test_engine*.py", "-m", "not slow"], 35),
                ("gpu_marked", ["tests", "-m", "gpu"], 25)],
        agree_n=20000, agree_k=512, agree_d=384, agree_trees=(64, 48), agree_q=2000, agree_store=4000,
        plan_n=1_000_000, plan_dim=384, plan_tenants=8, plan_kmeans=("two-level", "exact"),
        matmul=8192, assign_n=1_000_000, assign_k=50_000, assign_d=384, reps=2,
        lms=("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"), lm_batches=[64, 256, 1024], out_tokens=64,
        bpe_vocab=16000, enc_batches=[64, 256, 1024],
        ret_n=1_000_000, ret_q=10_000, ret_dim=384, ret_tenants=(1, 64), k=10,
        faiss_n=1_000_000, faiss_q=10_000),
    "rehearse": dict(
        pytest=[("triton", ["tests/test_triton_*.py", "-k", "all_invalid or module_level or switched_off"],
                 40)],
        agree_n=600, agree_k=24, agree_d=16, agree_trees=(4, 12), agree_q=50, agree_store=300,
        plan_n=3000, plan_dim=32, plan_tenants=3, plan_kmeans=("two-level", "exact"),
        matmul=256, assign_n=2000, assign_k=64, assign_d=32, reps=2,
        lms=("tiny-qwen2",), lm_batches=[2, 4], out_tokens=6, bpe_vocab=800, enc_batches=[4, 8],
        ret_n=5000, ret_q=200, ret_dim=32, ret_tenants=(1, 4), k=10,
        faiss_n=3000, faiss_q=100),
}


# --------------------------------------------------------------------------- shared bits
class Ctx:
    """What a step needs: sizes, the device, and ``emit`` (one record, written at once)."""

    def __init__(self, step: str, out: str, rehearse: bool):
        import torch

        self.step, self.out, self.rehearse = step, out, rehearse
        self.size = SIZES["rehearse" if rehearse else "gpu"]
        self.dev = torch.device("cpu" if rehearse else "cuda")
        self.device_name = "cpu" if rehearse else torch.cuda.get_device_name(0)
        self.deadline = time.perf_counter() + float(os.environ.get("MEMFOREST_STEP_LIMIT", "600"))
        self.emit = partial(append_record, os.path.join(out, RECORDS), step=step, device=self.device_name,
                            rehearse=rehearse)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def sync(self):
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(self, fn, reps: int = 1):
        """Best wall time of ``reps`` calls (synchronised) and the last result."""
        best, out = float("inf"), None
        for _ in range(reps):
            self.sync()
            t = time.perf_counter()
            out = fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
        return best, out

    def peak_mb(self):
        import torch

        return torch.cuda.max_memory_allocated() / 2 ** 20 if self.dev.type == "cuda" else None

    def reset_peak(self):
        import torch

        if self.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()


def fast_store(n: int, dim: int, *, tenants: int = 1, big_share: float = 0.5, seed: int = 0, device="cpu"):
    """A memory-like store built with array ops on ``device`` (1M nodes in about a second on a
    GPU): per tenant, embeddings drift through topics over time (a topic lasts ~12
    memories), timestamps an hour apart on average. Same idea as
    :func:`memforest_gpu.synthetic.synthetic_store`, without its per-node Python loop, and
    built straight into :class:`MemoryStore`'s documented fields (unique ids, unit float32
    rows, float64 times, one source per node) instead of through ``from_columns``, whose
    per-value validation takes longer than the benchmark itself at this size.
    Shape: -> MemoryStore, embeddings (n, dim)"""
    import numpy as np
    import torch

    from memforest_gpu.store import MemoryStore

    dev = torch.device(device)
    rng = np.random.default_rng(seed)
    if tenants > 1:
        n_big = int(round(n * big_share))
        sizes = np.full(tenants - 1, (n - n_big) // (tenants - 1))
        sizes[: (n - n_big) - sizes.sum()] += 1
        sizes = np.concatenate([[n_big], sizes])
    else:
        sizes = np.array([n])
    g = torch.Generator(device=dev).manual_seed(seed)
    embs, ts, ten, ids = [], [], [], []
    for t, size in enumerate(sizes.tolist()):
        n_topics = max(1, size // 40)
        centres = torch.randn(n_topics, dim, generator=g, device=dev)
        seg = np.cumsum(rng.random(size) < 0.08)  # a new topic segment starts with probability 0.08
        topic = torch.from_numpy(rng.integers(0, n_topics, seg[-1] + 1)[seg]).to(dev)
        embs.append(centres[topic] + 0.35 * torch.randn(size, dim, generator=g, device=dev))  # (size, dim)
        ts.append(1.6e9 + np.cumsum(rng.exponential(3600.0, size)))
        ten += [f"tenant-{t}"] * size
        ids += [f"t{t}-{i}" for i in range(size)]
    emb = torch.nn.functional.normalize(torch.cat(embs), dim=1)  # (n, dim)
    return MemoryStore(ids=ids, texts=[f"Memory {i} of {t}." for i, t in zip(ids, ten)], embeddings=emb,
                       timestamps=torch.from_numpy(np.concatenate(ts)).to(dev, torch.float64), tenants=ten,
                       sources=[[i] for i in ids], metadata=[{} for _ in ids])


# --------------------------------------------------------------------------- 1. agreement
def _pytest(ctx: Ctx, name: str, args: list[str], cap: float) -> None:
    limit = min(cap, ctx.left() - 25)  # leave time for the in-process checks
    if limit < 5:
        ctx.emit(name=f"pytest_{name}", status="skipped", summary="no time left in the step")
        return
    import glob

    args = [x for a in args for x in (sorted(glob.glob(os.path.join(ROOT, a))) if "*" in a else [a])]
    with tempfile.TemporaryDirectory() as d:
        xml = os.path.join(d, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            tail = (e.stdout or b"")[-800:]
            ctx.emit(name=f"pytest_{name}", status="timeout", summary=f"pytest killed at {limit:.0f} s",
                     args=args, output_tail=tail.decode() if isinstance(tail, bytes) else tail)
            return
        sec = time.perf_counter() - t0
        counts, failed = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}, []
        if os.path.exists(xml):
            root = ET.parse(xml).getroot()
            for suite in root.iter("testsuite"):
                for k in counts:
                    counts[k] += int(suite.get(k, 0))
            for case in root.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ok = r.returncode in (0, 5) and not failed  # 5: nothing collected (e.g. no gpu-marked test runs)
    ctx.emit(name=f"pytest_{name}", status="ok" if ok else "fail",
             summary=f"{passed} passed, {len(failed)} failed, {counts['skipped']} skipped in {sec:.0f} s",
             args=args, passed=passed, failed=failed[:30], skipped=counts["skipped"], rc=r.returncode, seconds=sec,
             output_tail=r.stdout[-600:] if not ok else "")


def _agree(ctx: Ctx, name: str, fn: Callable[[], dict]) -> None:
    t0 = time.perf_counter()
    try:
        fig = fn()
    except Exception as e:  # noqa: BLE001 - one failed check must not hide the others
        ctx.emit(name=name, status="error", summary=f"{type(e).__name__}: {e}"[:200])
        return
    ok = fig.pop("ok")
    ctx.emit(name=name, status="ok" if ok else "fail", seconds=time.perf_counter() - t0, **fig)


def _frac_equal(a, b) -> float:
    return float((a.cpu() == b.cpu()).float().mean()) if a.numel() else 1.0


def check_best_match(ctx: Ctx) -> dict:
    """The PyTorch assignment on the device against the same code on the CPU, same inputs."""
    import torch

    from memforest_gpu.kernels import best_match

    s = ctx.size
    g = torch.Generator().manual_seed(1)
    X = torch.nn.functional.normalize(torch.randn(1, s["agree_n"], s["agree_d"], generator=g), dim=-1)
    C = X[:, torch.randperm(s["agree_n"], generator=g)[: s["agree_k"]]]
    cv = torch.ones(1, s["agree_k"], dtype=torch.bool)
    v_ref, i_ref = best_match(X, C, cv, backend="torch")
    v, i = best_match(X.to(ctx.dev), C.to(ctx.dev), cv.to(ctx.dev), backend="torch")
    frac = _frac_equal(i, i_ref)
    diff = float((v.cpu() - v_ref).abs().max())
    return dict(ok=frac >= 0.9999 and diff <= 1e-4, index_agreement=frac, max_abs_score_diff=diff,
                summary=f"device vs cpu: {frac:.6f} of labels equal, max |score diff| {diff:.1e}",
                rule="labels equal for >= 99.99% of points (a near-tie may flip), scores within 1e-4",
                n=s["agree_n"], k=s["agree_k"], d=s["agree_d"])


def check_triton(ctx: Ctx) -> dict:
    """The Triton kernel against the explicit PyTorch path on the same device and inputs."""
    import torch

    from memforest_gpu.kernels import best_match
    from memforest_gpu.kernels.triton_assign import unavailable_reason

    why = unavailable_reason(ctx.dev)
    if why is not None:
        return dict(ok=False, summary=f"kernel cannot run: {why}", reason=why)
    s = ctx.size
    g = torch.Generator().manual_seed(2)
    X = torch.nn.functional.normalize(torch.randn(3, s["agree_n"] // 3, s["agree_d"], generator=g), dim=-1)
    C = torch.randn(3, s["agree_k"], s["agree_d"], generator=g)
    C[:, 5] = C[:, 1]  # duplicate centres: the lower index must win on both paths
    cv = torch.rand(3, s["agree_k"], generator=g) > 0.1
    cv[:, 1] = True
    X, C, cv = X.to(ctx.dev), C.to(ctx.dev), cv.to(ctx.dev)
    out = {}
    for mode in ("l2", "dot"):
        v_ref, i_ref = best_match(X, C, cv, mode=mode, backend="torch")
        v, i = best_match(X, C, cv, mode=mode, backend="triton")
        out[mode] = (_frac_equal(i, i_ref), float((v - v_ref).abs().max()))
    ok = all(f == 1.0 and d <= 1e-4 for f, d in out.values())
    return dict(ok=ok, agreement={m: f for m, (f, _) in out.items()},
                max_abs_score_diff={m: d for m, (_, d) in out.items()},
                summary=" ".join(f"{m}: {f:.6f} equal, |diff| {d:.1e};" for m, (f, d) in out.items()),
                rule="labels exactly equal, scores within 1e-4 (both fp32, tie rule: lowest index within TIE_EPS)")


def check_kmeans(ctx: Ctx) -> dict:
    """Batched k-means on the device against the CPU, same inputs and seeds."""
    import torch

    from memforest_gpu.kernels import kmeans

    s = ctx.size
    g = torch.Generator().manual_seed(3)
    T, n, d = 4, s["agree_n"] // 4, s["agree_d"]
    centres = torch.randn(T, 16, d, generator=g)
    X = torch.nn.functional.normalize(centres[:, torch.randint(0, 16, (n,), generator=g)]
                                      + 0.3 * torch.randn(T, n, d, generator=g), dim=-1)
    valid = torch.ones(T, n, dtype=torch.bool)
    valid[1, n // 2:] = False
    k = torch.tensor([16, 8, 16, 3])

    def inertia(X, labels, C):
        return float(((X - C.gather(1, labels.clamp(min=0)[..., None].expand_as(X))) ** 2).sum(-1)[valid].sum())

    lab_ref, C_ref, _, it_ref = kmeans(X, valid, k, seed=0)
    lab, C, _, it = kmeans(X.to(ctx.dev), valid.to(ctx.dev), k.to(ctx.dev), seed=0)
    lab, C = lab.cpu(), C.cpu()
    frac = float((lab == lab_ref)[valid].float().mean())
    j_ref, j = inertia(X, lab_ref, C_ref), inertia(X, lab, C)
    rel = abs(j - j_ref) / max(j_ref, 1e-12)
    return dict(ok=frac == 1.0 or rel <= 1e-3, label_agreement=frac, inertia_rel_diff=rel,
                iterations=[int(it_ref), int(it)],
                summary=f"device vs cpu: {frac:.4f} labels equal, inertia rel. diff {rel:.1e}",
                rule="labels equal, or inertia within 1e-3 relative (a float near-tie may move one point, "
                     "and Lloyd then diverges legitimately)")


def check_trees(ctx: Ctx) -> dict:
    """Batched maximum spanning trees on the device against the CPU (distinct weights: one tree)."""
    import torch

    from memforest_gpu.kernels import spanning_forest

    B, m = ctx.size["agree_trees"]
    g = torch.Generator().manual_seed(4)
    W = torch.rand(B, m, m, generator=g, dtype=torch.float64).float()
    W = (W + W.transpose(1, 2)) / 2  # exactly symmetric
    active = torch.rand(B, m, generator=g) > 0.1
    ref = spanning_forest(W, active)
    got = [t.cpu() for t in spanning_forest(W.to(ctx.dev), active.to(ctx.dev))]
    same = all(torch.equal(a, b) for a, b in zip((ref[0], ref[1], ref[3]), (got[0], got[1], got[3])))
    return dict(ok=same, edges_equal=same, trees=B, m=m,
                summary=f"{B} trees of {m}: edges {'identical' if same else 'DIFFER'} on device and cpu",
                rule="edge lists exactly equal (distinct weights)")


def check_retrieval(ctx: Ctx) -> dict:
    """Top-k and AGPR on the device against the CPU, same store and queries."""
    import torch

    from memforest_gpu import RetrievalConfig, Retriever

    s = ctx.size
    store = fast_store(s["agree_store"] * 3, 32, tenants=3, seed=5)
    g = torch.Generator().manual_seed(6)
    rows = torch.randint(0, len(store), (s["agree_q"],), generator=g)
    q = torch.nn.functional.normalize(store.embeddings[rows] + 0.2 * torch.randn(len(rows), 32, generator=g), dim=1)
    tens = [store.tenants[i] for i in rows.tolist()]
    out = {}
    for agpr in (False, True):
        cfg = RetrievalConfig(k=10, agpr=agpr)
        a = Retriever(store).search(q, tenants=tens, config=cfg)
        b = Retriever(store.to(ctx.dev)).search(q.to(ctx.dev), tenants=tens, config=cfg)
        out["agpr" if agpr else "topk"] = (_frac_equal(a.index, b.index),
                                           float((a.score - b.score.cpu()).nan_to_num(0, 0, 0).abs().max()))
    ok = all(f >= 0.999 and d <= 1e-4 for f, d in out.values())
    return dict(ok=ok, agreement={k: f for k, (f, _) in out.items()},
                summary=" ".join(f"{k}: {f:.4f} equal |diff| {d:.1e};" for k, (f, d) in out.items()),
                rule="hits equal for >= 99.9% (a near-tie of similarities may swap two), scores within 1e-4")


def check_engine(ctx: Ctx) -> dict:
    """compress() on the device: SPEC's invariants, and how much of the plan equals the CPU run."""
    from memforest_gpu import CompressConfig, MergeConfig, compress
    from memforest_gpu.quota import removal_target
    from memforest_gpu.synthetic import synthetic_store

    store = synthetic_store(ctx.size["agree_store"], tenants=3, dim=32, seed=7)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5, schedule="matching"))
    res = compress(store, cfg, device=ctx.dev)
    ref = compress(store, cfg, device="cpu")
    srcs = sorted(s for src in res.store.sources for s in src)
    every_once = srcs == sorted(store.ids)
    per_tenant = {t: store.tenants.count(t) for t in store.tenant_names()}
    out_tenant = {t: res.store.tenants.count(t) for t in per_tenant}
    exact_removal = all(per_tenant[t] - out_tenant[t] == removal_target(per_tenant[t], 0.5) for t in per_tenant)
    same = [frozenset(x) for x in res.store.sources] == [frozenset(x) for x in ref.store.sources]
    return dict(ok=every_once and exact_removal, every_original_once=every_once, exact_removal=exact_removal,
                same_output_as_cpu=same, nodes_in=len(store), nodes_out=len(res.store),
                summary=f"invariants {'hold' if every_once and exact_removal else 'BROKEN'}; "
                        f"output {'identical to' if same else 'differs from'} the cpu run",
                rule="every original id in exactly one output node; each tenant loses round(ratio * N_t); "
                     "equality with the cpu run is reported, not required (float near-ties)")


def step_agreement(ctx: Ctx) -> None:
    for name, args, cap in ctx.size["pytest"]:
        _pytest(ctx, name, args, cap)
    for name, fn in (("best_match_device_vs_cpu", check_best_match), ("triton_vs_torch", check_triton),
                     ("kmeans_device_vs_cpu", check_kmeans), ("trees_device_vs_cpu", check_trees),
                     ("retrieval_device_vs_cpu", check_retrieval), ("engine_invariants", check_engine)):
        _agree(ctx, name, partial(fn, ctx))


# --------------------------------------------------------------------------- 2. plan at 1M
def step_plan(ctx: Ctx) -> None:
    from gpu import plan

    from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig
    from memforest_gpu.host_reads import count_host_reads
    from memforest_gpu.kernels.triton_assign import fallback_reasons

    s = ctx.size
    t0 = time.perf_counter()
    store = fast_store(s["plan_n"], s["plan_dim"], tenants=s["plan_tenants"], seed=1, device=ctx.dev)
    build_s = time.perf_counter() - t0
    for kmeans in s["plan_kmeans"]:
        cfg = CompressConfig(partition=PartitionConfig(kmeans=kmeans, two_level_min_nodes=20000 if not ctx.rehearse
                                                       else 1000),
                             merge=MergeConfig(ratio=0.5, schedule="matching"))
        plan(fast_store(2000, s["plan_dim"], tenants=2, seed=2, device=ctx.dev), cfg, ctx.dev)  # warm-up
        ctx.reset_peak()
        ctx.sync()
        with count_host_reads() as reads:
            t = time.perf_counter()
            res = plan(store, cfg, ctx.dev)
            ctx.sync()
            sec = time.perf_counter() - t
        r = res.report
        stages = {f"{k}_s": v for k, v in r.seconds.items()}
        ctx.emit(name=f"plan_{kmeans}", summary=f"{sec:.2f} s for {len(store):,} nodes ({r.trees:,} trees, "
                 f"{len(res.merges):,} pairs planned), {reads.total:,} host reads",
                 n=len(store), dim=store.dim, tenants=s["plan_tenants"], kmeans=kmeans, schedule="matching",
                 seconds=sec, **stages, trees=r.trees, planned_pairs=len(res.merges),
                 kmeans_iterations=r.kmeans_iterations, host_reads=reads.total,
                 host_reads_by_name=dict(reads.by_name.most_common()), peak_gpu_mb=ctx.peak_mb(),
                 store_build_s=build_s, triton_fallbacks=fallback_reasons())


# --------------------------------------------------------------------------- 3. k-means throughput
def step_kmeans(ctx: Ctx) -> None:
    import torch

    from memforest_gpu.kernels import best_match
    from memforest_gpu.kernels.triton_assign import fallback_reasons, unavailable_reason

    s = ctx.size
    M = s["matmul"]
    ceiling = {}
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                               ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(M, M, device=ctx.dev, dtype=dtype)
        b = torch.randn(M, M, device=ctx.dev, dtype=dtype)
        a @ b
        sec, _ = ctx.timed(lambda: a @ b, reps=5)
        ceiling[label] = 2.0 * M ** 3 / sec / 1e12
        ctx.emit(name=f"matmul_{label}", summary=f"{ceiling[label]:.3g} TFLOP/s ({M}^3 matmul)", m=M, dtype=label,
                 seconds=sec, tflops=ceiling[label])
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    n, K, D = s["assign_n"], s["assign_k"], s["assign_d"]
    g = torch.Generator().manual_seed(0)
    gd = torch.Generator(device=ctx.dev).manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(1, n, D, generator=gd, device=ctx.dev), dim=-1)  # (1, n, D)
    C = X[:, torch.randperm(n, generator=g)[:K].to(ctx.dev)].clone()  # (1, K, D)
    cv = torch.ones(1, K, dtype=torch.bool, device=ctx.dev)
    flops = 2.0 * n * K * D
    ref_index = None
    for backend in ("torch", "torch-tf32", "triton"):
        if backend == "triton" and unavailable_reason(ctx.dev) is not None:
            ctx.emit(name="assign_triton", status="skipped", summary=unavailable_reason(ctx.dev))
            continue
        torch.backends.cuda.matmul.allow_tf32 = backend == "torch-tf32"
        call = partial(best_match, X, C, cv, backend="triton" if backend == "triton" else "torch")
        best_match(X[:, :512], C, cv, backend="triton" if backend == "triton" else "torch")  # warm-up / build
        sec, (_, idx) = ctx.timed(call, reps=s["reps"])
        tflops = flops / sec / 1e12
        agree = None
        if ref_index is None:
            ref_index = idx
        else:
            agree = _frac_equal(idx, ref_index)
        ctx.emit(name=f"assign_{backend}", summary=f"{tflops:.3g} TFLOP/s = {tflops / ceiling['tf32']:.1%} of TF32, "
                 f"{tflops / ceiling['bf16']:.1%} of bf16, {tflops / ceiling['fp32']:.1%} of fp32 matmul "
                 f"({sec:.3g} s)", n=n, k=K, d=D, backend=backend, seconds=sec, tflops=tflops,
                 frac_of_tf32=tflops / ceiling["tf32"], frac_of_bf16=tflops / ceiling["bf16"],
                 frac_of_fp32=tflops / ceiling["fp32"], labels_equal_to_torch_fp32=agree,
                 triton_fallbacks=fallback_reasons())
    torch.backends.cuda.matmul.allow_tf32 = False


# --------------------------------------------------------------------------- 4. LLM merges
def step_merge(ctx: Ctx) -> None:
    from gpu_llm import MINILM_L6, QWEN25, TINY_ENCODER, TINY_LM, encoder_throughput, lm_throughput
    from gpu_merge import sample_pairs

    s = ctx.size
    shapes = {**QWEN25, **TINY_LM}
    enc = TINY_ENCODER if ctx.rehearse else MINILM_L6
    pairs = sample_pairs(64)
    texts = [f"On {p.older.timestamp:.0f}: {p.older.text} Then: {p.newer.text}" for p in pairs]
    # the encoder first: it is cheap, and the 7B model may use the rest of the step
    encoder_throughput(enc, texts, s["enc_batches"], ctx.dev, ctx.emit, vocab=s["bpe_vocab"])
    for name in s["lms"]:
        if ctx.left() < 10:
            ctx.emit(name=f"merge_{name}", status="skipped", summary="no time left in the step")
            continue
        lm_throughput(name, shapes[name], sample_pairs, s["lm_batches"], s["out_tokens"], ctx.dev, ctx.emit,
                      vocab=s["bpe_vocab"])


# --------------------------------------------------------------------------- 5. retrieval
def _queries(store, Q: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, len(store), (Q,), generator=g)
    noise = 0.3 * torch.randn(Q, store.dim, generator=g) / store.dim ** 0.5
    e = store.embeddings[rows.to(store.device)] + noise.to(store.device)  # (Q, D) noisy copies of stored rows
    return torch.nn.functional.normalize(e, dim=1), [store.tenants[i] for i in rows.tolist()]


def step_retrieval(ctx: Ctx) -> None:
    from memforest_gpu import RetrievalConfig, Retriever

    s = ctx.size
    for tenants in s["ret_tenants"]:
        store = fast_store(s["ret_n"], s["ret_dim"], tenants=tenants, big_share=0.5, seed=3, device=ctx.dev)
        q, tens = _queries(store, s["ret_q"])
        r = Retriever(store)
        for agpr in (False, True):
            cfg = RetrievalConfig(k=s["k"], agpr=agpr)
            r.search(q[:64], tenants=tens[:64], config=cfg)  # warm-up
            sec, res = ctx.timed(lambda: r.search(q, tenants=tens, config=cfg), reps=2)
            kind = "agpr" if agpr else "topk"
            ctx.emit(name=f"retrieval_{kind}_t{tenants}", summary=f"{len(q) / sec:,.0f} queries/s ({sec * 1e3:.0f} ms "
                     f"for {len(q):,} queries, {len(store):,} nodes, {tenants} tenants)", n=len(store),
                     tenants=tenants, queries=len(q), k=s["k"], agpr=agpr, seconds=sec, qps=len(q) / sec,
                     hits_found=float((res.index >= 0).float().mean()))


# --------------------------------------------------------------------------- 6. faiss-gpu, vLLM
def step_optional(ctx: Ctx) -> None:
    import importlib.util

    try:
        import faiss
    except ImportError as e:
        ctx.emit(name="faiss", status="skipped", summary=f"faiss not importable: {e}")
    else:
        _faiss(ctx, faiss)
    if importlib.util.find_spec("vllm") is None:
        ctx.emit(name="vllm", status="skipped", summary="vllm not importable")
    elif ctx.dev.type != "cuda":
        ctx.emit(name="vllm", status="skipped", summary="vllm needs CUDA (rehearsal runs on the CPU)")
    else:
        _vllm(ctx)


def _faiss(ctx: Ctx, faiss) -> None:
    from memforest_gpu import RetrievalConfig, Retriever
    from memforest_gpu.index import IndexConfig, IndexedRetriever

    s = ctx.size
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    store = fast_store(s["faiss_n"], s["ret_dim"], tenants=1, seed=4, device=ctx.dev)
    q, tens = _queries(store, s["faiss_q"], seed=1)
    cfg = RetrievalConfig(k=s["k"], agpr=True)
    exact = Retriever(store).search(q, tenants=tens, config=cfg)
    for kind in ("faiss-flat", "faiss-ivf"):
        t0 = time.perf_counter()
        r = IndexedRetriever(store, IndexConfig(kind=kind, nprobe=32))
        build = time.perf_counter() - t0
        r.search(q[:64], tenants=tens[:64], config=cfg)
        sec, res = ctx.timed(lambda: r.search(q, tenants=tens, config=cfg), reps=2)
        got = {ix.kind for ix in r.indexes.values()}
        ctx.emit(name=kind, summary=f"{len(q) / sec:,.0f} queries/s on {sorted(got)}, "
                 f"{_frac_equal(res.index, exact.index):.4f} of AGPR hits equal to exact", n=len(store),
                 queries=len(q), seconds=sec, qps=len(q) / sec, build_s=build, index_kinds=sorted(got),
                 faiss_gpus=gpus, agreement_with_exact=_frac_equal(res.index, exact.index))


def _vllm(ctx: Ctx) -> None:
    """vLLM with dummy (random) weights of the Qwen2.5-0.5B shape: merges/s at the GPU batch sizes."""
    import json

    import torch

    from gpu_llm import QWEN25, chatml_tokenizer
    from gpu_merge import sample_pairs
    from memforest_gpu.mergers.prompt import SYSTEM_PROMPT, build_messages
    from memforest_gpu.mergers.vllm_offline import VLLMMerger, free_memory_utilization

    pairs = sample_pairs(max(ctx.size["lm_batches"]))
    with tempfile.TemporaryDirectory() as d:
        tok = chatml_tokenizer([SYSTEM_PROMPT] + [p.older.text for p in pairs], ctx.size["bpe_vocab"])
        tok.save_pretrained(d)
        cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
               **QWEN25["qwen2.5-0.5b"], "bos_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        util = free_memory_utilization(reserve_gib=4.0)
        m = VLLMMerger(d, dtype="bfloat16", max_tokens=ctx.size["out_tokens"], gpu_memory_utilization=util,
                       engine_options={"load_format": "dummy"})
        t0 = time.perf_counter()
        m.load()
        load_s = time.perf_counter() - t0
        import vllm

        m.sampling_ = vllm.SamplingParams(temperature=0.0, max_tokens=m.max_tokens, min_tokens=m.max_tokens, seed=0)
        for b in ctx.size["lm_batches"]:
            convs = [build_messages(p) for p in pairs[:b]]
            before = dict(m.stats)
            sec, _ = ctx.timed(lambda: m._generate(convs))
            ctok = m.stats["completion_tokens"] - before["completion_tokens"]
            ctx.emit(name=f"vllm_qwen2.5-0.5b_b{b}", summary=f"{b / sec:.1f} merges/s, {ctok / sec:,.0f} gen tok/s",
                     batch=b, seconds=sec, merges_per_s=b / sec, completion_tokens_per_s=ctok / sec, load_s=load_s,
                     gpu_memory_utilization=util, note="vLLM load_format=dummy: random weights, real throughput")
    del m
    torch.cuda.empty_cache()


STEP_FUNCS = {"agreement": step_agreement, "plan": step_plan, "kmeans": step_kmeans, "merge": step_merge,
              "retrieval": step_retrieval, "optional": step_optional}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=list(STEP_FUNCS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args(argv)
    if a.rehearse:
        # the Triton kernel runs in its interpreter; triton reads this when it is imported
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not a.rehearse and not torch.cuda.is_available():
        append_record(os.path.join(a.out, RECORDS), step=a.step, name="step", status="fail",
                      summary="no CUDA device (use --rehearse on a CPU)")
        return 1
    if a.rehearse:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    STEP_FUNCS[a.step](Ctx(a.step, a.out, a.rehearse))
    return 0


if __name__ == "__main__":
    sys.exit(main())
